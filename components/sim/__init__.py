"""The simulated Greengrass core: runs unmodified components locally (`edgeinfer sim`)."""
