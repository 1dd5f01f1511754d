"""ODDL stage 2, while a job runs: `control_unit` (REQUEST / GRANT / RELEASE, per flow),
`job` (the job spec and the one job runner), `workloads` (the collective engine), `wire`
(the control messages' format), `invariants` (the checker), `trace` (timelines) and
`verify` (the model checker over every interleaving). Imports `stage1`, `base` and
`oddl.fpga` only."""
