"""ODDL stage 1, before a job runs: the plan (WSS wavelength tables, routes), the planner,
placement of jobs on the grid, and the arbiter that applies a plan to the devices and
reads it back. Imports `base` and `oddl.fpga` only."""
