"""The sim back end: the device models in process, the real drivers on top, a virtual clock.

Each O-NIC is a register-accurate board (sim/devices/onic_board.py) registered as a pynq device;
the control units reach it through pynq MMIO and drivers/onic.py exactly as they reach a
real board, and take its interrupt line as `oddl node` does. WSSs are the in-process model;
the bus is the in-process bus with modelled latency and faults. Stage 2 runs in this
process: one `JobRunner` for every node. The baseline networks (`ModelBackend`) are
flow-level models on the same clock, with the same runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynq
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import traffic
from oddl.controller.base.config import FaultSpec, NetworkSpec, Testbed
from oddl.controller.base.messages import Flow
from oddl.controller.base.topology import Grid
from oddl.controller.service.backend import (
    Announce,
    FlowRow,
    Iteration,
    JobOutcome,
    JobStopped,
    OnIteration,
    RunFailed,
    StopRule,
    at_once,
)
from oddl.controller.service.health import Health, Heartbeat, Heartbeats, Unwatched, read_heartbeat
from oddl.controller.serving.lifecycle import close_loop
from oddl.controller.stage1.arbiter import one_by_one
from oddl.controller.stage2.control_unit import ControlUnit, FlowFailed, UnitFactory
from oddl.controller.stage2.invariants import InvariantChecker, tag_of
from oddl.controller.stage2.job import (
    JobRunner,
    JobSpec,
    quiet_ns,
    schedule_of,
    step_sync,
    timing_of,
)
from oddl.drivers.onic import DriverONic, ONicDriver
from oddl.fpga import regmap as R
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.devices.bus import LocalBus
from oddl.sim.devices.fabric import Fabric
from oddl.sim.devices.faults import Drill
from oddl.sim.devices.onic_board import BoardLine, ONicBoard
from oddl.sim.devices.pynq_device import BASE_ADDR, EmulatedONicDevice
from oddl.sim.devices.wss import WSSModel
from oddl.sim.networks.electrical import FlowNetwork
from oddl.sim.networks.topoopt import Topology
from oddl.sim.steady import Steady


@dataclass
class World:
    """The modelled testbed: fabric, boards (with their drivers), WSSs, bus, checker."""

    fabric: Fabric
    boards: dict[str, Any]  # ONicBoard, or RtlBoard (the gateware in the loop)
    onics: dict[str, DriverONic]
    lines: dict[str, BoardLine]
    wss: dict[str, WSSModel]
    bus: LocalBus
    checker: InvariantChecker
    unit: UnitFactory = ControlUnit  # each node's control unit: Python, or the gateware's
    rtl_units: list[Any] = field(default_factory=list)  # the gateware's, as made


def _unit_model(tb: Testbed, grid: Grid, made: list[Any], ready: bool) -> UnitFactory:
    """The testbed's `control_model`: the Python unit, or the RTL in the loop (each one
    kept in `made`, for the decision latencies it measured; `ready`: a core for every node
    made now, not when a job starts)."""
    if tb.testbed.control_model == "board":  # onic_top boards: the unit is theirs
        from oddl.drivers.onic_unit import gateware_unit

        return gateware_unit
    if tb.testbed.control_model != "rtl":
        return ControlUnit
    from oddl.sim.devices.rtl_control_unit import Bounds, RtlControlUnit, prepare

    bounds = Bounds.of(timing_of(tb), len(grid.nodes))  # the testbed's, as Python's
    if ready:
        prepare(bounds, tb.testbed.rtl_simulator, len(grid.nodes))

    def rtl(*args: Any) -> RtlControlUnit:
        u = RtlControlUnit(*args, nodes=grid.nodes, bounds=bounds,
                           simulator=tb.testbed.rtl_simulator)
        made.append(u)
        return u
    return rtl


def decision_cycles(units: list[Any]) -> dict[str, Any]:
    """The gateware units' decision latencies in clock cycles (a REQUEST in to its GRANT
    out; a GRANT in to the transfer engine's start): count, min, median, max."""
    out: dict[str, Any] = {"model": "rtl", "simulator": units[0].simulator, "clock_mhz": 250}
    for k in ("request_to_grant", "grant_to_start"):
        xs = sorted(x for u in units for x in u.latency[k])
        if xs:
            out[f"{k}_cycles"] = {"count": len(xs), "min": xs[0], "median": xs[len(xs) // 2],
                                  "max": xs[-1]}
    return out


def build(tb: Testbed, grid: Grid, clock: Clock, seed: int = 0,
          checker_mode: str = "raise", real_time: bool = False) -> World:
    """The modelled testbed. `real_time` (an emulator): whatever a job would otherwise
    make when it starts, and stall the loop with, is made now."""
    checker = InvariantChecker(mode=checker_mode)
    fabric = Fabric(tb, grid, clock, checker)
    index = {n: i for i, n in enumerate(grid.nodes)}
    boards: dict[str, Any] = {}
    onics: dict[str, DriverONic] = {}
    # the control network: the host's units', or (onic_top) the boards' own
    bus = LocalBus(clock, round(tb.control.latency_ns), seed, tap=checker.on_message)
    board_class: Any = ONicBoard
    if tb.testbed.board_model == "rtl":
        from oddl.sim.devices.rtl_board import RtlBoard

        board_class = functools.partial(
            RtlBoard, simulator=tb.testbed.rtl_simulator,
            unit=(bus, timing_of(tb)) if tb.testbed.control_model == "board" else None)
    elif tb.testbed.control_model == "board":
        board_class = functools.partial(ONicBoard, unit=(bus, timing_of(tb)))
    for n in grid.nodes:
        board = boards[n] = board_class(fabric, n, index, grid.nodes)
        mmio = pynq.MMIO(BASE_ADDR, R.IP_RANGE, device=EmulatedONicDevice(board))
        onics[n] = DriverONic(ONicDriver(mmio, n, grid.nodes, index), fabric.ports[n])
    made: list[Any] = []
    return World(fabric, boards, onics, {n: BoardLine(b) for n, b in boards.items()},
                 dict(fabric.wss), bus, checker, _unit_model(tb, grid, made, real_time), made)


def lone_board(board_model: str = "python") -> tuple[ONicDriver, Any]:
    """One O-NIC board alone, behind its register driver (the Python model or the RTL):
    for what needs only its count-action engine and DAC valid lines (Lightning's
    inference). Returns (driver, board); `board.set_dac_valid(i)` is DAC i's line."""
    from oddl.controller.base.config import grid_testbed

    tb = grid_testbed(1, 2).with_board_model(board_model)
    grid = Grid.from_testbed(tb)
    world = build(tb, grid, Clock(VirtualClockLoop()))
    node = grid.nodes[0]
    return world.onics[node].d, world.boards[node]


@contextlib.contextmanager
def _holding(runners: dict[str, JobRunner], nodes: list[str], runner: JobRunner
             ) -> Iterator[None]:
    """The job's nodes map to its runner while it runs (several jobs share a back end)."""
    runners.update(dict.fromkeys(nodes, runner))
    try:
        yield
    finally:
        for n in nodes:
            if runners.get(n) is runner:
                del runners[n]


async def run_in_process(runner: JobRunner, loop: asyncio.AbstractEventLoop,
                         on_iteration: OnIteration, sent: Callable[[], int],
                         record_flows: bool,
                         between: Callable[[int], None] = lambda i: None,
                         pause: Callable[[], int] = lambda: 0,
                         steady: Steady | None = None) -> None:
    """Every rank is here: iteration i + 1 begins the instant the last rank ends i
    (`between(i + 1)` first: it may stop the job there by raising), or `pause()` ns
    later. `steady`: once the job's iteration repeats (sim/steady.py), the rest are its
    copies, and the job ends with the last of them."""
    spec = runner.spec
    done: asyncio.Future[None] = loop.create_future()
    rows: list[FlowRow] = []
    last = [0]

    def fail(exc: BaseException) -> None:
        if not done.done() and not loop.is_closed():
            done.set_exception(exc)

    def loop_error(_loop: Any, context: dict[str, Any]) -> None:
        fail(context.get("exception") or RuntimeError(context.get("message", "loop error")))

    if record_flows:
        def hook(f: Flow, t: int) -> None:
            rows.append((f.id, f.step, f.src, f.dst, f.nbytes, f.hop + 1, f.t_submit, t))
        runner.engine.on_delivered_hook = hook

    def begin(i: int) -> None:
        try:
            between(i)
        except Exception as e:
            fail(e)
            return
        if steady is not None and steady.probing(i):  # first of all at its compute's end
            runner.clock.call_later_ns(spec.compute_ns, steady.probe, i)
        runner.begin(i)

    def finished(i: int, t_start: int, t_end: int) -> None:
        msgs = sent()
        trace = runner.trace.drain() if runner.trace is not None else []
        it = Iteration(i, t_start, t_end, msgs - last[0], rows.copy(), trace)
        on_iteration(it)
        last[0] = msgs
        rows.clear()
        copies = steady.extend(it, spec.iterations) if steady is not None else None
        for c in copies or ():
            on_iteration(c)
        if steady is not None:
            steady.boundary(it)
        if i + 1 < spec.iterations and copies is None:
            ns = pause()
            if ns > 0:
                runner.clock.call_later_ns(ns, begin, i + 1)
            else:
                begin(i + 1)
        elif not done.done():
            done.set_result(None)

    runner.on_iteration = finished
    runner.fail = fail
    loop.set_exception_handler(loop_error)
    begin(spec.start)
    try:
        await done
    finally:
        runner.close()


def extended(out: JobOutcome, steady: Steady | None) -> JobOutcome:
    """A job's outcome, with what its copies add (sim/steady.py), if it was extended."""
    if steady is None or steady.extension is None:
        return out
    return steady.extension.outcome(out)


class SimBackend:
    """The ODDL network on the modelled testbed, watched as a lab's is: every node beats
    from its board's registers, the drill's faults happen in virtual time."""

    name = "sim"

    def __init__(self, tb: Testbed, grid: Grid, faults: list[FaultSpec] | None = None,
                 seed: int = 0, checker_mode: str = "record",
                 announce: Announce | None = None) -> None:
        self.announce = announce  # `oddl run --publish`: notes for the bus's watchers
        self.tb = tb
        self.loop = VirtualClockLoop()
        self.clock = Clock(self.loop)
        self.world = w = build(tb, grid, self.clock, seed, checker_mode)
        self.onics = w.onics
        self.wss = w.wss
        self.monitor = w.checker
        self.health = Health.of(tb, grid)
        self.health.start(self.clock.now_ns())  # every board beats from here on
        self._runners: dict[str, JobRunner] = {}  # node -> the runner of the job on it
        self._pauses: dict[str, int] = {}  # running job -> ns its next iteration waits
        self._retired = 0  # REQUEST retries of the runners that are gone (the drill's count)
        self.drill = Drill(w, self.clock, faults or [], self._retries, self._effect)
        self.injected = self.drill.injected
        self.cut: dict[str, JobOutcome] = {}  # (a model's jobs are not cancelled)
        self._beats = [Heartbeats(self.clock, self.health.period_ns,
                                  functools.partial(self._read, n), self._send).start()
                       for n in grid.nodes]

    def _effect(self, f: FaultSpec, on: bool) -> None:
        if f.kind == "dead-board" and on:
            self._gone(f.target)

    def _gone(self, node: str) -> None:
        """A dead board's node program is gone with it: its control unit says nothing."""
        r = self._runners.get(node)
        if r is not None:
            r.gone(node)

    def _retries(self) -> int:
        runners = {id(r): r for r in self._runners.values()}.values()
        return self._retired + sum(r.stats().get("retries", 0) for r in runners)

    def _read(self, node: str, seq: int) -> Heartbeat | None:
        if node in self.world.fabric.dead:
            return None  # a dead board says nothing
        return read_heartbeat(node, seq, self.onics[node], self._runners.get(node))

    def _send(self, hb: Heartbeat) -> None:
        """A heartbeat crosses the control bus as any message does (not when it is down)."""
        bus = self.world.bus
        if bus.passes(hb.node):
            self.clock.call_later_ns(bus.latency_ns, self._beat, hb)

    def _beat(self, hb: Heartbeat) -> None:
        self.health.beat(hb, self.clock.now_ns())

    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool, stop: StopRule, extend: bool = False) -> JobOutcome:
        w, health = self.world, self.health
        self.monitor.new_job(spec.job, spec.tag, spec.nodes)
        runner = JobRunner(spec, self.clock, self.monitor, lambda *_: None)
        runner.on_onics(w.bus, w.onics, w.lines, w.unit)
        self.drill.arm()
        next_i = [spec.start]
        stall_ns = quiet_ns(spec) + round(self.tb.monitor.grace_ms * 1e6)
        progress: list[Any] = [(-1, -1), self.clock.now_ns()]  # (bus, fabric) marks, when

        def outcome() -> JobOutcome:
            return self._outcome(runner, runner.sent())

        def between(i: int) -> None:
            next_i[0] = i
            if stop.faults():
                raise JobStopped(f"stopped before iteration {i}: {stop.why()}", i, False,
                                 outcome())
            self.drill.at_iteration(i)

        def cut(why: str, missing: list[int]) -> None:
            runner.fail(JobStopped(f"iteration {next_i[0]} cut short: {why}", next_i[0], True,
                                   outcome(), len(missing), runner.engine.carry_of(next_i[0])))

        def guard() -> None:
            """Each period: an iteration a pending fault keeps from finishing is cut short;
            so is one whose flows went on no further for `stall_ns` (light a fault
            swallowed before anyone saw it: they go again); one with nothing undelivered
            and no progress stops the run, naming what it waits for."""
            now = self.clock.now_ns()
            mark = (runner.sent(), runner.engine.flows)  # the job's own: others go on
            if mark != progress[0]:
                progress[0], progress[1] = mark, now
            overdue, stalled = stop.overdue(now), now - progress[1] > stall_ns
            if not (overdue or stalled):
                timer[0] = self.clock.call_later_ns(health.period_ns, guard)
                return
            # (only now: the checker's list of flows grows with the run)
            missing = [f for f in self.monitor.undelivered() if tag_of(f) == spec.tag]
            quiet = (f"no progress for {(now - progress[1]) / 1e6:.0f} ms: {len(missing)} "
                     f"flows undelivered, e.g. ids {missing[:5]}")
            if overdue:
                cut(stop.why(), missing)
            elif missing:
                cut(f"{quiet} (their light lost, or their messages)", missing)
            else:
                runner.fail(RunFailed(f"the run stalled: {quiet}"))

        timer = [self.clock.call_later_ns(health.period_ns, guard)]
        # copies only while no fault is to come from the drill, none found waits to stop
        # the job at its next iteration, and the watch has read what the last one left
        # (`missed` periods judge every kind; the watch, an observer, is not in the key)
        settle_ns = (self.tb.monitor.missed + 1) * health.period_ns

        def quiet() -> bool:
            changed = self.drill.last_change_ns()
            return not self.drill.plan.to_come() and not stop.faults() and \
                (changed is None or self.clock.now_ns() >= changed + settle_ns)

        steady = Steady(self.loop, lambda: [w, runner], outcome, spec.start, (guard,),
                        quiet) if extend else None
        try:
            with _holding(self._runners, spec.nodes, runner):
                for node in w.fabric.dead:
                    self._gone(node)
                await run_in_process(runner, self.loop, on_iteration,
                                     runner.sent, record_flows, between, steady=steady)
        except FlowFailed as e:
            if e.peer is not None:
                health.flow_failed(e.peer, self.clock.now_ns(), str(e))
            raise JobStopped(f"iteration {next_i[0]} cut short: {e}", next_i[0], True,
                             outcome(), len(self.monitor.undelivered()),
                             runner.engine.carry_of(next_i[0])) from e
        finally:
            timer[0].cancel()
            self._retired += runner.stats().get("retries", 0)
        if spec.tag:
            self.monitor.job_left(spec.tag, self.clock.now_ns())
        return extended(outcome(), steady)

    def _outcome(self, runner: JobRunner, sent: int) -> JobOutcome:
        w = self.world
        fires = sum(b.fires for b in w.boards.values())
        stats = {**runner.stats(), "dropped": w.bus.dropped, "step_sync": step_sync(runner.spec),
                 "count_action_fires": fires,
                 "messages_dropped": w.bus.dropped, "messages_delayed": w.bus.delayed,
                 "transfers": w.fabric.transfers, "lost_to_faults": w.fabric.lost,
                 "tunes": sum(t.tunes for t in w.fabric.tx.values())}
        if w.rtl_units:
            stats["control_unit"] = decision_cycles(w.rtl_units)
        return JobOutcome(sent, runner.engine.flows, stats, list(self.monitor.violations))

    def pause(self, job: str, ns: int) -> bool:
        return False  # ODDL: a job's partition is its own, no link to share

    fan_out = staticmethod(one_by_one)  # models on one clock: one call after the other
    off_loop = staticmethod(at_once)

    def close(self) -> None:
        self.drill.finish()
        for b in self._beats:
            b.stop()
        for board in self.world.boards.values():
            board.close()
        close_loop(self.loop)  # a stopped run's tasks end first, none destroyed pending


class ModelBackend:
    """A baseline network (electrical, fat-tree, SiP-Ring, TopoOpt): a flow-level model, in
    every back end (there is no such hardware here); no devices, nothing to plan."""

    name = "model"

    def __init__(self, spec: NetworkSpec, tb: Testbed, ranks: list[str],
                 checker_mode: str = "record", announce: Announce | None = None) -> None:
        self.announce = announce
        self.spec = spec
        self.tb = tb
        self.ranks = ranks
        self.loop = VirtualClockLoop()
        self.clock = Clock(self.loop)
        self.onics: dict[str, Any] = {}
        self.wss: dict[str, Any] = {}
        self.monitor = InvariantChecker(mode=checker_mode)
        self.health = Unwatched()
        self.injected: list[Any] = []
        self.cut: dict[str, JobOutcome] = {}
        self._switch: FlowNetwork | None = None  # one network, every job's flows on it
        self._runners: dict[str, JobRunner] = {}  # node -> the runner of the job on it
        self._pauses: dict[str, int] = {}  # running job -> ns its next iteration waits

    def _deliver(self, flow: Flow) -> None:
        self._runners[flow.dst].deliver(flow)

    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool, stop: StopRule, extend: bool = False) -> JobOutcome:
        """Jobs run at once share the one network's links, max-min fair."""
        from oddl.sim.networks.baselines import build_network

        self.monitor.new_job(spec.job, spec.tag, spec.nodes)
        runner = JobRunner(spec, self.clock, self.monitor, lambda *_: None)
        if self._switch is None:  # placed by the first job's traffic, where it places
            r = spec.ranks
            pairs = traffic(schedule_of(spec))
            links = [(r[a], r[b]) for a, b in Topology.of(spec.hybrid, self.spec.degree).links] \
                if spec.hybrid is not None and self.spec.kind == "topoopt" else None
            self._switch = build_network(
                self.spec, self.clock, self.ranks, self.tb.optical.line_rate_gbps,
                self._deliver, {(r[a], r[b]): n for (a, b), n in pairs.items()}, links)
        switch = self._switch
        switch.sharing.join(spec.tag, spec.weight)
        runner.on_network(switch.submit)
        flows0, law0 = switch.flows, switch.sharing.describe()  # this job's share of both

        def outcome() -> JobOutcome:
            law = {k: round(v - law0.get(k, 0), 1)
                   for k, v in switch.sharing.describe().items()}
            return JobOutcome(0, runner.engine.flows,
                              {"transfers": switch.flows - flows0, **switch.describe(), **law},
                              list(self.monitor.violations))
        steady = Steady(self.loop, lambda: [switch, runner], outcome, spec.start) \
            if extend else None
        self._pauses[spec.job] = 0
        try:
            with _holding(self._runners, spec.ranks, runner):
                await run_in_process(runner, self.loop, on_iteration, lambda: 0, record_flows,
                                     pause=lambda: self._take_pause(spec.job), steady=steady)
        finally:
            self._pauses.pop(spec.job, None)
        if spec.tag:
            self.monitor.job_left(spec.tag, self.clock.now_ns())
        return extended(outcome(), steady)

    def pause(self, job: str, ns: int) -> bool:
        if job not in self._pauses:
            return False
        self._pauses[job] += ns
        return True

    def _take_pause(self, job: str) -> int:
        ns, self._pauses[job] = self._pauses[job], 0
        return ns

    fan_out = staticmethod(one_by_one)  # no devices: nothing to fan out
    off_loop = staticmethod(at_once)

    def close(self) -> None:
        close_loop(self.loop)
