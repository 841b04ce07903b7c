"""The real ``promtool`` (Prometheus's rule checker) for the tests, from
Debian's ``prometheus`` package: ``apt-get download`` it, unpack it with
``dpkg -x`` and keep its ``promtool`` in the virtualenv
(``.venv/opt/prometheus/promtool``), once; no service is installed or
started.  ``apt-get update`` runs first only when apt does not know the
package yet (a fresh machine).  It took 1.3 s here, 2.6 s with the update;
``make clean`` removes it with the virtualenv.

A file lock makes parallel pytest runs of one virtualenv wait for the
first one's install instead of racing it; promtool is moved into place in
one rename, so a run that died mid-install leaves nothing half-made.

``PROMTOOL=/path/to/promtool`` uses that binary instead.  Nothing here is
skipped: without apt or the registry the install fails with apt's words.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "prometheus"
HOME = Path(sys.prefix) / "opt" / "prometheus"
INSTALL_TIMEOUT_S = 600  # apt-get update + a 19 MB download on a slow mirror


def promtool() -> Path:
    """The promtool binary, installed on first use."""
    override = os.environ.get("PROMTOOL")
    if override:
        return Path(override)
    tool = HOME / "promtool"
    if tool.exists():
        return tool
    HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(HOME.parent / "prometheus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not tool.exists():
            _install()
    return tool


def _install() -> None:
    with tempfile.TemporaryDirectory(dir=HOME.parent, prefix=".prometheus-") as tmp:
        work = Path(tmp)
        deb = _download(work)
        _run(["dpkg", "-x", str(deb), str(work / "root")])
        (work / "home").mkdir()  # promtool alone: the server binary is 3/4 of the package
        os.replace(work / "root" / "usr" / "bin" / "promtool", work / "home" / "promtool")
        os.replace(work / "home", HOME)


def _download(work: Path) -> Path:
    """The package's .deb in ``work`` (apt's lists updated if need be)."""
    try:
        _run(["apt-get", "download", PACKAGE], cwd=work)
    except RuntimeError:
        _run(["apt-get", "update"], cwd=work)
        _run(["apt-get", "download", PACKAGE], cwd=work)
    debs = sorted(work.glob(f"{PACKAGE}_*.deb"))
    if len(debs) != 1:
        raise RuntimeError(f"apt-get download {PACKAGE} left {debs} in {work}")
    return debs[0]


def _run(argv: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
