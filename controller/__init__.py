"""The oddl control plane, in the parts of the design, each importing only those below it
(pyproject's import contracts hold this):

- `service`: the arbiter at run time: the orchestration of jobs, health, the node
  program, the back-end interface, the drill's plan, the testbed lock, recovery;
- `stage2`: the O-NIC control units, the job runner and its workloads, the wire format,
  the invariant checker, timelines, the model checker;
- `stage1`: the plan, the planner, placement, CASSINI's compatibility, and the arbiter
  that applies a plan and reads it back;
- `serving`: the scaffold every long-lived service stands on (its lifecycle, its HTTP);
- `base`: the vocabulary every part shares: configs, names, fault kinds, the grid,
  collectives, control messages, device interfaces, the clock, bus names and rights,
  telemetry notes, extras.

Above it: the back ends (`oddl.sim`, `oddl.drivers`) and the application (`oddl.app`);
below it, `oddl.fpga`.
"""

__version__ = "0.6.0"

from oddl.controller.base import compiled as _compiled

_compiled.install()  # before any hot module of the control plane is imported
