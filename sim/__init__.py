"""The simulated back end, in parts: `devices/` (the device models and the emulated
devices' servers), `networks/` (the flow-level network models the baselines run on),
`backend` (the sim back end over both, and the baselines' back end), `steady` (a job's
exactly repeated iteration found, and its copies written rather than simulated), `clock`
(the virtual-time loop) and `emulate` (the `oddl emulate` program, which serves the
devices).
"""

import oddl.controller  # noqa: F401  (its finder chooses a hot module's build)
