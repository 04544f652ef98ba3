"""Package discovery for the `components/` + `cloud/` layout (one import namespace, `edgeinfer`).

pyproject.toml holds all metadata; this file only maps folders to packages, which the declarative
`[tool.setuptools]` table cannot express for two roots without listing every subpackage by hand.
"""

from setuptools import find_packages, setup

_ROOTS = {"edgeinfer": "components", "edgeinfer.cloud": "cloud"}

packages = []
package_dir = {}
for name, folder in _ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
