"""bkctl bookie start|stop|restart ID and bkctl log-server start|stop|restart
ID: one process of a running appliance, the others untouched.

Thin commands over the supervisor's control channel
(``appliance.supervisor.control``): the supervisor does the stopping and
starting; these commands ask it, then wait (polling, with a deadline) until
what they asked for is visible: a stopped process's exit in the state file,
a started one answering with its new pid.  ``bkctl bookie fix-cookie ID``
uses ``start_again`` to bring the bookie back on a running appliance.
"""

from __future__ import annotations

import time

import click

from cli.common import config_option, library_errors

PROBE_TIMEOUT_MS = 500
REQUEST_TIMEOUT_MS = 10_000  # the supervisor answers between two watches (ping_interval_ms)
POLL_S = 0.1  # between two looks at the state file or the process


class _Kind:
    """A bookie or a log server: its words, its ids, how to ask it its pid."""

    def __init__(self, name: str, group: str):
        self.name, self.group = name, group

    def check_id(self, config, process_id: str) -> None:
        ids = [b.id for b in config.bookies] if self.name == "bookie" \
            else config.log_server_ids()
        if process_id not in ids:
            raise click.ClickException(f"{config.path} has no {self.name} {process_id!r}: "
                                       f"its {self.name}s are {', '.join(ids) or 'none'}")

    def answering_pid(self, config, process_id: str) -> int | None:
        # on use: keeps bkctl's start-up short (cli/__init__.py)
        from appliance.logservice.probe import log_server_info
        from appliance.supervisor.probe import bookie_info, probe_curve

        if self.name == "bookie":
            info = bookie_info(config.bookie(process_id).endpoint, PROBE_TIMEOUT_MS,
                               curve=probe_curve(config))
        else:
            info = log_server_info(config.log_server_endpoint(process_id), PROBE_TIMEOUT_MS,
                                   curve=probe_curve(config))
        return (info or {}).get("pid")


BOOKIE, LOG_SERVER = _Kind("bookie", "bookie"), _Kind("log server", "log-server")


def ask_supervisor(config, op: str, process_id: str) -> dict:
    """The supervisor's reply to ``op`` on ``process_id``; ClickException
    when no supervisor runs the config, it does not answer, or it refuses."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.control import ask, control_endpoint, control_unavailable
    from appliance.supervisor.supervisor import read_state, supervisor_alive

    state = read_state(config)
    if not supervisor_alive(state):
        raise click.ClickException(f"no supervisor runs {config.path}: start the appliance "
                                   "with `bkctl up --detach` (it starts every process)")
    if (why := control_unavailable(config)) is not None:
        raise click.ClickException(f"the supervisor of {config.path} takes no requests: {why}")
    reply = ask(config, op, process_id, REQUEST_TIMEOUT_MS)
    if reply is None:
        raise click.ClickException(
            f"the supervisor (pid {state['pid']}) did not answer at {control_endpoint(config)} "
            f"within {REQUEST_TIMEOUT_MS} ms: see {config.run_path / 'supervisor.log'}")
    if not reply.get("ok"):
        raise click.ClickException(f"the supervisor refused: {reply.get('error')}")
    return reply


def _run_record(config, process_id: str) -> dict:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.supervisor import read_state

    return ((read_state(config) or {}).get("runs") or {}).get(process_id) or {}


def wait_stopped(config, process_id: str) -> None:
    """Until the supervisor has recorded the exit of ``process_id``."""
    sup = config.supervisor
    timeout_s = (sup.stop_timeout_ms + 2 * sup.ping_interval_ms) / 1000.0 + 5.0
    deadline = time.monotonic() + timeout_s
    while _run_record(config, process_id).get("pid") is not None:
        if time.monotonic() > deadline:
            raise click.ClickException(f"{process_id} did not stop within {timeout_s:.0f} s: "
                                       f"see {config.run_path / (process_id + '.log')}")
        time.sleep(POLL_S)  # a poll interval, not a wait for an event we could watch


def wait_answering(config, kind: _Kind, process_id: str, old_pid: int | None) -> int:
    """Until ``process_id`` answers with a pid other than ``old_pid``; that
    pid.  ClickException if the supervisor leaves it down (it refused to
    start) or it does not answer within ``start_timeout_ms``."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.runs import describe_exit

    timeout_s = config.supervisor.start_timeout_ms / 1000.0
    deadline = time.monotonic() + timeout_s
    while True:
        pid = kind.answering_pid(config, process_id)
        if pid is not None and pid != old_pid:
            return pid
        run = _run_record(config, process_id)
        if run.get("given_up"):
            raise click.ClickException(f"{process_id} did not start: "
                                       f"{describe_exit(run.get('last_exit'))}")
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"{process_id} did not answer within {timeout_s:.0f} s (start_timeout_ms; "
                f"the supervisor keeps watching it): see {config.run_path / process_id}.log")
        time.sleep(POLL_S)  # a poll interval, not a wait for an event we could watch


def start_again(config, kind: _Kind, process_id: str) -> str:
    """Ask the supervisor to start ``process_id`` and wait until it answers;
    the line saying so."""
    reply = ask_supervisor(config, "start", process_id)
    if reply["note"] == "already running":
        return f"{process_id} is already running (pid {reply['pid']})"
    pid = wait_answering(config, kind, process_id, reply.get("was_pid"))
    return f"{process_id} started (pid {pid}) and answering"


def _load(config_path: str):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config

    return load_config(config_path)


def _stop(config, kind: _Kind, process_id: str) -> str:
    reply = ask_supervisor(config, "stop", process_id)
    wait_stopped(config, process_id)
    was = f" (was pid {reply['was_pid']})" if reply.get("was_pid") else ""
    return (f"{process_id} stopped{was}; the supervisor leaves it down until "
            f"`bkctl {kind.group} start {process_id}`")


def _restart(config, kind: _Kind, process_id: str) -> str:
    reply = ask_supervisor(config, "restart", process_id)
    pid = wait_answering(config, kind, process_id, reply.get("was_pid"))
    return f"{process_id} restarted (pid {pid}) and answering"


# name -> (summary, help, action): {kind} is "bookie" or "log server", {group}
# its command group; each help ends with an example.
ACTIONS = {
    "start": ("Start one {kind} of the running appliance.", """Start the {kind} ID now
    on the running appliance (its supervisor, `bkctl up`, starts it; the other
    processes are not touched): one the operator stopped, or one the supervisor
    left down (it refused to start, or exited restarts_max times within
    restart_window_ms); its restart backoff starts afresh. Waits until it
    answers.""", start_again),
    "stop": ("Stop one {kind}; it stays down.", """Stop the {kind} ID of the running
    appliance cleanly (SIGTERM; SIGKILL after supervisor.stop_timeout_ms), the
    other processes untouched. The supervisor does not restart it and
    `bkctl status` shows it stopped by the operator (not a failure) until
    `bkctl {group} start`, or until the appliance is stopped and started again.
    Waits until it has exited.""", _stop),
    "restart": ("Restart one {kind}, the others untouched.", """Stop the {kind} ID of
    the running appliance cleanly and start it again (after a config change of
    it, or when it is stuck), the other processes untouched. Not counted in its
    `restarts` (those count failures). Waits until its new process answers.""",
                _restart),
}


def _command(kind: _Kind, name: str, example_id: str) -> click.Command:
    summary, text, action = ACTIONS[name]
    words = {"kind": kind.name, "group": kind.group}

    @click.command(name=name, short_help=summary.format(**words),
                   help=text.format(**words) + f"""

    \b
    Example:
      bkctl {kind.group} {name} {example_id}""")
    @click.argument("process_id", metavar="ID")
    @config_option
    @library_errors
    def command(process_id, config_path):
        config = _load(config_path)
        kind.check_id(config, process_id)
        click.echo(action(config, kind, process_id))

    return command


def commands(kind: _Kind, example_id: str) -> list[click.Command]:
    """``start``, ``stop`` and ``restart`` for one kind of process."""
    return [_command(kind, name, example_id) for name in ACTIONS]


@click.group(name="log-server", short_help="Start, stop or restart one log server.")
def log_server():
    """Log servers of a running appliance (`[log] servers`): start, stop or
    restart one, the others and the bookies untouched."""
