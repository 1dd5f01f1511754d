"""The `oddl` command line, a thin layer over `oddl.app.api`: `main` (the group, and how
every command ends: its one voice for errors and stops), and a module a command group:
`experiments` (check, plan, compat, run, sweep; `run_report`, what `run` prints), `lab`
(emulate, node, dashboard, broker-config, accept), `queue` (the arbiter and its clients),
`verify`, `gateware`, and `devices` (lightning, countaction, regmap), `optinc`;
`notebookless`: pynq imported without the notebooks' IPython, in every command's process."""

from oddl.app.cli import devices, experiments, gateware, lab, optinc, queue, verify
from oddl.app.cli.main import main

__all__ = ["devices", "experiments", "gateware", "lab", "main", "optinc", "queue", "verify"]
