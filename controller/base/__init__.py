"""The vocabulary every part of the control plane shares: `config` (testbeds, experiments
and their schemas), `catalog` (the names), `faultkinds`, `topology` (the grid and its WSS
groups), `collectives` and `jumps`, `messages` (control messages), `devices` (the device
interfaces), `clock`, `access` (bus topics and rights), `telemetry` (notes), `parallelism`
(hybrid splits), `layers` (models layer by layer, from the shipped tables), `accelerators`
(the devices their compute is reckoned on), `ddp` (data parallelism as DDP runs it),
`extras` (the optional installs), `throttle` (how often a repeated
complaint is logged), `hostload` (this host's load, said beside a verdict a late
answer can give), `compiled` (which modules run compiled) and `fixedmath` (arithmetic
that gives the same bits on every x86-64). It imports nothing of the control
plane's above it (only `oddl.fpga`)."""
