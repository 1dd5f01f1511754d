"""The vocabulary every part of the control plane shares: configs and their schemas, the
catalogue of names, fault kinds, the grid and its WSS groups, collectives and jumps,
control messages, device interfaces, the clock, bus topics and rights, telemetry notes.
It imports nothing of the control plane's above it (only `oddl.fpga`)."""
