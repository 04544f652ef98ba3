"""`edgeinfer build`: the bundle as Greengrass and the GDK take it.

`artifacts/<Component>/<Version>/` (the greengrass-cli layout: a wheel of the project for the code
components, the model files for the model store), recipes with artifact digests and the GDK layout
`greengrass-build/`. Deterministic and idempotent: the same sources give byte-identical artifacts,
so publishing twice is a no-op.
"""
