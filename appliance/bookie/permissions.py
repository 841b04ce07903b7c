"""Local security at boot: the bookie's data must be its owner's only.

Everything the appliance creates is owner-only (directories 0700, files
0600, ipc socket files 0600: ``storage.aligned_io.FILE_MODE`` / ``DIR_MODE``,
and the bookie and supervisor processes run with umask 077).  Directories
made before that, or by hand, may be more open: ``open_paths`` finds them
and the bookie logs one line for each, naming the fix, at every boot (it
still starts: refusing would take a working appliance down over a mode an
operator may have chosen).  docs/SECURITY.md has the threat model.
"""

from __future__ import annotations

import os
import stat

GROUP_OTHER = 0o077


def open_paths(paths: dict[str, object]) -> list[str]:
    """One line per existing path whose mode gives group or others any access."""
    lines = []
    for what, path in paths.items():
        if not path:
            continue
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError:
            continue
        if mode & GROUP_OTHER:
            wanted = "700" if os.path.isdir(path) else "600"
            lines.append(f"{what} {path} is open to other local users (mode {mode:04o}): "
                         f"chmod {wanted} {path} (docs/SECURITY.md)")
    return lines
