"""The sim back end: device models in process, an in-process bus, one virtual clock."""

from __future__ import annotations

from dataclasses import dataclass

from controller.clock import Clock
from controller.config import Faults, Testbed
from controller.topology import Grid
from sim.bus import LocalBus
from sim.fabric import Fabric
from sim.invariants import InvariantChecker
from sim.onic import SimONic


@dataclass
class SimTestbed:
    fabric: Fabric
    onics: dict[str, SimONic]
    wss: dict[str, object]
    bus: LocalBus
    checker: InvariantChecker


def build(tb: Testbed, grid: Grid, clock: Clock, faults: Faults | None = None, seed: int = 0,
          checker_mode: str = "raise") -> SimTestbed:
    checker = InvariantChecker(mode=checker_mode)
    fabric = Fabric(tb, grid, clock, checker)
    onics = {n: SimONic(fabric, n) for n in grid.nodes}
    bus = LocalBus(clock, round(tb.control.latency_ns), faults, seed, tap=checker.on_message)
    return SimTestbed(fabric, onics, dict(fabric.wss), bus, checker)
