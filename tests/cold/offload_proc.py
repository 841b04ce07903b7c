"""`bkctl log offload NAME` in a process of its own that kills itself
(SIGKILL) when its mover reaches STEP (``appliance.cold.mover.STEPS``): the
crash tests' fault, injected through the mover's ``on_step`` hook from this
test-side child rather than a switch in the product.

    python -m tests.cold.offload_proc CONFIG NAME STEP
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import appliance
from appliance.cold.mover import STEPS, offloader
from tests.support.bkctl import CLI_TIMEOUT_S, REPO


def kill_at(step: str):
    """An ``on_step`` hook: SIGKILL this process when the mover passes ``step``."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")

    def on_step(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return on_step


def main(config: str, name: str, step: str) -> int:
    with appliance.connect(config) as bk:
        offloader(bk, b"", on_step=kill_at(step)).offload(name)
    return 0  # the step was not reached (nothing to move)


def offload_killed_at(config, name: str, step: str) -> subprocess.CompletedProcess:
    """Run this module to its end; its stderr captured (text)."""
    return subprocess.run([sys.executable, "-m", "tests.cold.offload_proc", str(config), name,
                           step], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
