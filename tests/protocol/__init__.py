"""Unit tests of the pure protocol core (appliance.protocol) and appliance.digest."""
