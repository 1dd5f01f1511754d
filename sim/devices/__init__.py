"""The devices, modelled: `fabric` (the light), `wss` (the WSS model) and `wss_serial`
(its instrument on a pseudo-terminal), `onic_board` (the register-accurate O-NIC),
`onic_unit` (the stage-2 control unit inside an `onic_top` board: its register block
and the board's transfer engine), `pynq_device` (it behind pynq) and `pynq_remote`
(behind PYNQ.remote), `serial_rtl` (the ECP5 build Verilated behind a pty), `rtl_board` (the
gateware simulated in its place), `rtl_control_unit` (the stage-2 control unit's gateware
in a node's place) and `rtl_lockstep` (it held to the Python unit in the model checker's
worlds), `qick_soc` and `qick_pyro` (a QICK board), `lightning_datapath` (Lightning's
datapath in its fabric), `bus` (the
in-process control bus), `broker` (the embedded MQTT broker), `faults` (the drill's
effects), `control` (the emulator's drill endpoint), `realtime` (the emulator's loop).
Imports `sim.clock` and the control plane, never `sim.networks` or `sim.backend`."""
