"""The O-NIC's control IP in Amaranth HDL: `onic_ctrl` (the design) and `build` (its
Verilog, a Yosys synthesis, the Vivado recipe's place)."""
