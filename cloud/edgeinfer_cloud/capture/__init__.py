"""`edgeinfer capture list | pull`: the records devices captured to S3, found by thing group, model and
time, and brought home as a folder `edgeinfer model build` calibrates and gates on."""
