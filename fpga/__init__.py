"""The software/FPGA contract of the O-NIC: `regmap` (the register map), `countaction`
(the count-action language), `countaction_image` (its programs compiled to the engine's
registers and back), `overlay` (the overlay's metadata and its check), `frame` (the shape
of a control frame on the O-NIC's port), `serial_frames` (the serial bridge's frames),
`datapath` (Lightning's datapath as the host and the board exchange it), and `gateware/`,
the IP behind them."""
