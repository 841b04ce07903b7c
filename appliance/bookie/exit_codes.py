"""How a bookie process ends, for the supervisor that watches it.

* 0: stopped on request (SIGTERM / SIGINT), storage closed cleanly;
* ``EXIT_FAILED`` (2): it failed (a disk error, a bug, the metadata store
  unreachable at boot): a restart may well help, so the supervisor restarts
  it with backoff;
* ``EXIT_REFUSED`` (78, ``EX_CONFIG`` of sysexits.h): it refused to start
  for a reason a restart cannot change (its disks' cookies do not match,
  the config is wrong for it).  Its last stderr line names the fix; the
  supervisor records that line and leaves it down until the operator acts
  (``bkctl down`` then ``bkctl up`` after the fix).
"""

EXIT_FAILED = 2
EXIT_REFUSED = 78
