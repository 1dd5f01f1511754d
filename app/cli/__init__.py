"""The `oddl` command line: a thin layer over `oddl.app.api`, one module a
command group (configs and experiments; the testbed and its services; the devices' own
tools)."""

from oddl.app.cli import devices, experiments, gateware, lab, queue, verify
from oddl.app.cli.main import main

__all__ = ["devices", "experiments", "gateware", "lab", "main", "queue", "verify"]
