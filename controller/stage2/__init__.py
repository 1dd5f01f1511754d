"""ODDL stage 2, while a job runs: the O-NIC control unit (REQUEST / GRANT / RELEASE, per
flow), the job spec and the one job runner, the workloads' collective engine, the wire
format of control messages, the invariant checker and stage-2 timelines. Imports
`stage1`, `base` and `oddl.fpga` only."""
