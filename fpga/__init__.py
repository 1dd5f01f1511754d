"""The software/FPGA contract of the O-NIC: `regmap` (the register map), `countaction`
(the count-action language and its compiler), `overlay` (the overlay's metadata and its
check), and `gateware/`, the IP behind them."""
