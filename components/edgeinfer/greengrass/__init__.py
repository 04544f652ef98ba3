"""Greengrass v2 as both nuclei define it: the recipe model and what each nucleus accepts.

`edgeinfer.greengrass.recipe` reads, validates and resolves recipes (the one model that the simulator,
the bundle build and publishing share); `edgeinfer.greengrass.nuclei` holds the observable differences
between the classic nucleus and nucleus lite and `check_recipe`, which says what a nucleus would refuse.
"""
