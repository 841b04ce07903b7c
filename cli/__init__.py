"""bkctl: the command line."""
