"""ODDL stage 1, before a job runs: `plan` (WSS wavelength tables, routes), `planner`,
`placement` of jobs on the grid, `compat` (CASSINI's compatibility of jobs sharing
links), and `arbiter`, which applies a plan to the devices and reads it back. Imports
`serving`, `base` and `oddl.fpga` only."""
