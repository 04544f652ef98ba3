"""pytest fixtures for the simulated Greengrass core (filled in by the sim work)."""
