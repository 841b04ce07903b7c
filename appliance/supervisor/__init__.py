"""Room of the supervisor (``python -m appliance.supervisor``, ``bkctl up``).

* ``supervisor``: formats new bookie directories, spawns, pins, watches,
  restarts and stops the bookies of one config;
* ``probe``: one INFO round trip to a bookie (liveness, ``bkctl status``).
"""
