"""The O-NIC's gateware in Amaranth HDL: `onic_ctrl` (the register IP; its bus's parts in
`onic_bus`, its count-action engine's in `onic_engine`), `control_unit` (the stage-2
control unit; its receiver's states in `control_unit_rx`), `onic_top` (the two in one IP:
the unit in the datapath), `build` (their Verilog, a Yosys synthesis, the Vivado recipe's
place), `board` (the whole top placed, routed, timed and packed for an ECP5 board by
PyPI's open flow), `serial_bridge` (the register map over a UART), `serial_top` (the O-NIC
a lab drives over USB serial) and `verilated` (a design compiled by Verilator, driven from
Python)."""
