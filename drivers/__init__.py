"""Real device I/O: `onic` (the O-NIC over pynq MMIO), `onic_unit` (stage 2 handed to a board
whose gateware holds the control unit, by registers), `irq` (its interrupt line), `wss`
(a WSS over pyserial), `serial_board` (a board's registers over its USB serial port),
`mqtt` (the control bus), `lightning` (Lightning's multiply over QICK),
`lightning_mac` (its multiply-accumulate: streams on modulator pairs, calibrated), `lab`
(the emu and hw back end), `job_tally` (what the controller has heard of a job),
`local_board` (a board only its node program touches), `drill` (faults through an
emulator's endpoint), `announce` (notes for the bus's watchers), `cassette` (every
exchange with the devices, recorded and replayed), `seal` (a cassette's signature),
`soc_tape` (a QICK soc's calls on a cassette) and `soc_values` (the values they carry, as
data). Drivers speak to hardware or to an emulator at the device boundary; they never
import the models."""

import oddl.controller  # noqa: F401  (its finder chooses a hot module's build)
