"""The package list, found rather than written: every folder of the design card installs
under the one import name `oddl` (`controller/` as `oddl.controller`, ...), and each of its
sub-packages is discovered, so a new one can never be left out of the wheel.

Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_packages, setup

# the top-level folders and the names they install as (`oddl` itself is a namespace)
ROOTS = {
    "oddl.app": "app",
    "oddl.studies": "studies",
    "oddl.controller": "controller",
    "oddl.fpga": "fpga",
    "oddl.drivers": "drivers",
    "oddl.sim": "sim",
    "oddl.acceptance": "tests/acceptance",  # the hardware acceptance checks ship with oddl
}


def discovered() -> list[str]:
    return [name for root, folder in ROOTS.items()
            for name in (root, *(f"{root}.{p}" for p in find_packages(folder)))]


setup(packages=discovered(), package_dir=ROOTS)
