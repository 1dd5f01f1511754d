"""The sim back end: emulated boards in process, the real drivers on top, one virtual clock.

Each O-NIC is a register-accurate board (sim/onic_board.py) registered as a pynq device;
the control units reach it through pynq MMIO and drivers/onic.py exactly as they reach a
real board. WSSs are the in-process model; the bus is the in-process bus.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynq
from oddl.controller.clock import Clock
from oddl.controller.config import Faults, Testbed
from oddl.controller.topology import Grid
from oddl.drivers.onic import DriverONic, ONicDriver
from oddl.fpga import regmap as R
from oddl.sim.bus import LocalBus
from oddl.sim.fabric import Fabric
from oddl.sim.invariants import InvariantChecker
from oddl.sim.onic_board import ONicBoard
from oddl.sim.pynq_device import BASE_ADDR, EmulatedONicDevice
from oddl.sim.wss import WSSModel


@dataclass
class SimTestbed:
    fabric: Fabric
    boards: dict[str, ONicBoard]
    onics: dict[str, DriverONic]
    wss: dict[str, WSSModel]
    bus: LocalBus
    checker: InvariantChecker


def build(tb: Testbed, grid: Grid, clock: Clock, faults: Faults | None = None, seed: int = 0,
          checker_mode: str = "raise") -> SimTestbed:
    checker = InvariantChecker(mode=checker_mode)
    fabric = Fabric(tb, grid, clock, checker)
    index = {n: i for i, n in enumerate(grid.nodes)}
    boards: dict[str, ONicBoard] = {}
    onics: dict[str, DriverONic] = {}
    for n in grid.nodes:
        board = boards[n] = ONicBoard(fabric, n, index)
        mmio = pynq.MMIO(BASE_ADDR, R.IP_RANGE, device=EmulatedONicDevice(board))
        onic = onics[n] = DriverONic(ONicDriver(mmio, n, grid.nodes), fabric.ports[n])
        board.on_irq = onic.on_interrupt  # the interrupt line
    bus = LocalBus(clock, round(tb.control.latency_ns), faults, seed, tap=checker.on_message)
    return SimTestbed(fabric, boards, onics, dict(fabric.wss), bus, checker)
