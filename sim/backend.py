"""The sim back end: the device models in process, the real drivers on top, a virtual clock.

Each O-NIC is a register-accurate board (sim/onic_board.py) registered as a pynq device;
the control units reach it through pynq MMIO and drivers/onic.py exactly as they reach a
real board, and take its interrupt line as `oddl node` does. WSSs are the in-process model;
the bus is the in-process bus with modelled latency and faults. Stage 2 runs in this
process: one `JobRunner` for every node. The baseline networks (`ModelBackend`) are
flow-level models on the same clock, with the same runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynq
from oddl.controller.backend import FlowRow, Iteration, JobOutcome, OnIteration
from oddl.controller.clock import Clock
from oddl.controller.config import Faults, NetworkSpec, Testbed
from oddl.controller.invariants import InvariantChecker
from oddl.controller.job import JobRunner, JobSpec, step_sync
from oddl.controller.messages import Flow
from oddl.controller.topology import Grid
from oddl.drivers.onic import DriverONic, ONicDriver
from oddl.fpga import regmap as R
from oddl.sim.bus import LocalBus
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.fabric import Fabric
from oddl.sim.onic_board import BoardLine, ONicBoard
from oddl.sim.pynq_device import BASE_ADDR, EmulatedONicDevice
from oddl.sim.wss import WSSModel


@dataclass
class World:
    """The modelled testbed: fabric, boards (with their drivers), WSSs, bus, checker."""

    fabric: Fabric
    boards: dict[str, ONicBoard]
    onics: dict[str, DriverONic]
    lines: dict[str, BoardLine]
    wss: dict[str, WSSModel]
    bus: LocalBus
    checker: InvariantChecker


def build(tb: Testbed, grid: Grid, clock: Clock, faults: Faults | None = None, seed: int = 0,
          checker_mode: str = "raise") -> World:
    checker = InvariantChecker(mode=checker_mode)
    fabric = Fabric(tb, grid, clock, checker)
    index = {n: i for i, n in enumerate(grid.nodes)}
    boards: dict[str, ONicBoard] = {}
    onics: dict[str, DriverONic] = {}
    for n in grid.nodes:
        board = boards[n] = ONicBoard(fabric, n, index)
        mmio = pynq.MMIO(BASE_ADDR, R.IP_RANGE, device=EmulatedONicDevice(board))
        onics[n] = DriverONic(ONicDriver(mmio, n, grid.nodes), fabric.ports[n])
    bus = LocalBus(clock, round(tb.control.latency_ns), faults, seed, tap=checker.on_message)
    return World(fabric, boards, onics, {n: BoardLine(b) for n, b in boards.items()},
                 dict(fabric.wss), bus, checker)


async def run_in_process(runner: JobRunner, loop: asyncio.AbstractEventLoop,
                         on_iteration: OnIteration, sent: Callable[[], int],
                         record_flows: bool) -> None:
    """Every rank is here: iteration i + 1 begins the instant the last rank ends i."""
    spec = runner.spec
    done: asyncio.Future[None] = loop.create_future()
    rows: list[FlowRow] = []
    last = [0]

    def fail(exc: BaseException) -> None:
        if not done.done():
            done.set_exception(exc)

    def loop_error(_loop: Any, context: dict[str, Any]) -> None:
        fail(context.get("exception") or RuntimeError(context.get("message", "loop error")))

    if record_flows:
        def hook(f: Flow, t: int) -> None:
            rows.append((f.id, f.step, f.src, f.dst, f.nbytes, f.hop + 1, f.t_submit, t))
        runner.engine.on_delivered_hook = hook

    def finished(i: int, t_start: int, t_end: int) -> None:
        msgs = sent()
        on_iteration(Iteration(i, t_start, t_end, msgs - last[0], rows.copy()))
        last[0] = msgs
        rows.clear()
        if i + 1 < spec.iterations:
            runner.begin(i + 1)
        elif not done.done():
            done.set_result(None)

    runner.on_iteration = finished
    runner.fail = fail
    loop.set_exception_handler(loop_error)
    runner.begin(0)
    try:
        await done
    finally:
        runner.close()


class SimBackend:
    """The ODDL network on the modelled testbed."""

    name = "sim"

    def __init__(self, tb: Testbed, grid: Grid, faults: Faults | None = None, seed: int = 0,
                 checker_mode: str = "record") -> None:
        self.loop = VirtualClockLoop()
        self.clock = Clock(self.loop)
        self.world = build(tb, grid, self.clock, faults, seed, checker_mode)
        self.onics = self.world.onics
        self.wss = self.world.wss
        self.monitor = self.world.checker

    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool) -> JobOutcome:
        w = self.world
        self.monitor.new_job(spec.job)
        runner = JobRunner(spec, self.clock, self.monitor, lambda *_: None)
        runner.on_onics(w.bus, w.onics, w.lines)
        await run_in_process(runner, self.loop, on_iteration, lambda: w.bus.sent,
                             record_flows)
        fires = sum(m.fire_count for b in w.boards.values() for m in b.ca)
        stats = {**runner.stats(), "dropped": w.bus.dropped, "step_sync": step_sync(spec),
                 "count_action_fires": fires,
                 "messages_dropped": w.bus.dropped, "messages_delayed": w.bus.delayed,
                 "transfers": w.fabric.transfers,
                 "tunes": sum(t.tunes for t in w.fabric.tx.values())}
        return JobOutcome(w.bus.sent, runner.engine.flows, stats, list(self.monitor.violations))

    def close(self) -> None:
        self.loop.close()


class ModelBackend:
    """A baseline network (electrical, fat-tree, SiP-Ring, TopoOpt): a flow-level model, in
    every back end (there is no such hardware here); no devices, nothing to plan."""

    name = "model"

    def __init__(self, spec: NetworkSpec, tb: Testbed, ranks: list[str],
                 checker_mode: str = "record") -> None:
        self.spec = spec
        self.tb = tb
        self.ranks = ranks
        self.loop = VirtualClockLoop()
        self.clock = Clock(self.loop)
        self.onics: dict[str, Any] = {}
        self.wss: dict[str, Any] = {}
        self.monitor = InvariantChecker(mode=checker_mode)

    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool) -> JobOutcome:
        from oddl.sim.baselines import build_network

        self.monitor.new_job(spec.job)
        runner = JobRunner(spec, self.clock, self.monitor, lambda *_: None)
        switch = build_network(self.spec, self.clock, self.ranks,
                               self.tb.optical.line_rate_gbps, runner.deliver)
        runner.on_network(switch.submit)
        await run_in_process(runner, self.loop, on_iteration, lambda: 0, record_flows)
        return JobOutcome(0, runner.engine.flows, {"transfers": switch.flows},
                          list(self.monitor.violations))

    def close(self) -> None:
        self.loop.close()
