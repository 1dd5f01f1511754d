"""The `oddl` command line: a thin layer over `oddl.controller.operator.api`, one module a
command group (configs and experiments; the testbed and its services; the devices' own
tools)."""

from oddl.controller.operator.cli import arbiter, devices, experiments, gateware, lab, verify
from oddl.controller.operator.cli.main import main

__all__ = ["arbiter", "devices", "experiments", "gateware", "lab", "main", "verify"]
