"""The oddl control plane, in the parts of the design (each may import only those below it;
pyproject's import contracts hold this):

- `operator`: what people use: the CLI, the public API, the dashboard, the acceptance
  runner, the session that opens a testbed for a run;
- `experiments`: the runner (every network of an experiment on the same jobs), results and
  run directories, sweeps, figures, link studies;
- `registry`: the one place a back end (sim, emu, hw) is chosen;
- `service`: the arbiter at run time: the orchestration of jobs (admission, placement per
  job, stops and recovery), health, the node program beside each O-NIC, the back-end
  interface, the testbed lock, CASSINI's compatibility;
- `stage2`: the O-NIC control units, the job runner and its workloads, the wire format,
  the invariant checker, timelines;
- `stage1`: the plan, the planner, placement and the arbiter that applies and reads back;
- `base`: the vocabulary every part shares: configs, the catalogue of names, fault kinds,
  the grid, collectives, control messages, device interfaces, the clock, bus names and
  rights, telemetry notes.

The back ends (`oddl.sim`, `oddl.drivers`) sit between the application (experiments,
operator, registry) and the core (service and below); `oddl.fpga` is the bottom.
"""

__version__ = "0.1.0"
