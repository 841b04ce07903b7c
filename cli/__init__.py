"""bkctl: the command line.

Every command module imports the library it drives inside the command's
function, not at the top (the comment beside each says so): ``bkctl`` then
loads only what the command it runs needs.  ``bkctl --help`` takes 0.09 s
(58 ms of imports); with every command's imports at the top it would load
~800 ms of modules (the supervisor, the client, re-replication, the
benchmarks and pyspark) before printing a line.  Measured 2026-11-27.
"""
