"""Unit tests of the pure protocol core (appliance.protocol) and appliance.checks.digest."""
