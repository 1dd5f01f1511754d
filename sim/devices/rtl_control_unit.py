"""The stage-2 control unit in gateware (fpga/gateware/control_unit.py), simulated cycle by
cycle in Amaranth's simulator behind the Python `ControlUnit`'s interface, so that the model
checker's worlds, the differential test and a run can hold one against the other.

The harness plays the unit's surroundings: the MAC (a message on the bus becomes a frame
in wire.py's layout, a frame out becomes a message), the transfer engine (a start becomes the
O-NIC's `send` / `tune_and_send`, its completions the unit's strobes) and the host (routes,
flows, a delivery or failure). The RTL is clocked only while it has work, at the model's
instant of that work (as sim/devices/rtl_board.py clocks `onic_ctrl`): its timers compare
deadlines with `ts_ns`, so an idle span changes nothing. Each armed timer is a timer on the
model's clock, created in the order the RTL arms them; when one fires, that timer alone is
enabled for the step, so that events at one instant happen in the model's order.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import Bus, ONic
from oddl.controller.base.extras import require
from oddl.controller.base.messages import ControlMessage, Flow, Grant
from oddl.controller.base.telemetry import PortView
from oddl.controller.base.throttle import worth_logging
from oddl.controller.stage1.plan import Route
from oddl.controller.stage2.control_unit import FlowFailed, Timing
from oddl.controller.stage2.trace import Tracer
from oddl.controller.stage2.wire import FRAME, decode_frame, encode_frame
from oddl.fpga.gateware.verilated import Ports, TestbenchPorts

log = logging.getLogger(__name__)
CLOCK_HZ = 250e6
_SHOWN = ("idle", "requesting", "sending", "idle")  # the RTL's transmitter states


@dataclass(frozen=True)
class Bounds:
    """The RTL's memories: routes (node indices), and the testbed's bounds, which the
    Python unit keeps too (`Timing`: flow_queue, request_queue, requests_per_sender,
    delivered_keys)."""

    nodes: int = 64
    txq: int = 64
    rxq: int = 64
    done: int = 64
    per_sender: int = 4

    @classmethod
    def of(cls, t: Timing, nodes: int) -> Bounds:
        """A unit's for `nodes` nodes (the route table: a power of two) and timing `t`."""
        return cls(max(cls.nodes, 1 << (nodes - 1).bit_length()), t.flow_queue,
                   t.request_queue, t.delivered_keys, t.requests_per_sender)


@dataclass
class Framer:
    """A node's control messages as its MAC's frames: one a frame cannot carry (a field too
    wide, a name not in `index`) is dropped, as a MAC never delivers it, counted and
    logged."""

    node: str
    index: dict[str, int]
    ports: Sequence[str]
    dropped: int = 0

    def __call__(self, m: ControlMessage) -> int | None:
        try:
            return encode_frame(m, self.index, self.ports)
        except ValueError as e:
            self.dropped += 1
            if worth_logging(self.dropped):
                log.warning("%s: a message no frame carries dropped (%d so far): %s",
                            self.node, self.dropped, e)
            return None


@dataclass
class _Op:
    kind: str  # routes, submit, frame, tx_done, rx_done, timer
    port: int = 0
    value: int = 0
    extra: int = 0
    done: bool = False
    cycles: int = 0
    # (cycle, order, what, value): what the RTL did, in the order it did it
    effects: list[tuple[int, int, str, Any]] = field(default_factory=list)
    state: dict[str, int] = field(default_factory=dict)  # its counters and timers after


_FRAME_LATENCY = 2  # a frame written is staged, queued the cycle after, out the next


def _drive(io: Ports, u: RtlControlUnit, op: _Op, ports: int, nbw: int) -> Iterator[None]:
    """One event into the unit, as its surroundings would present it: yields for each
    clock edge (the caller's simulator ticks), and after each, takes what came out."""

    def tick() -> Iterator[None]:
        yield
        op.cycles += 1
        if not io.get("effect"):
            return
        c, fx = op.cycles, op.effects
        if io.get("tx_tvalid"):
            fx.append((c - _FRAME_LATENCY, 0, "frame", io.get("tx_tdata")))
        if io.get("start_valid"):
            fx.append((c, 2, "start", (io.get("start_port"), io.get("start_tune"),
                                       io.get("start_channel"), io.get("start_flow"))))
        if io.get("deliver_valid"):
            fx.append((c, 2, "deliver", io.get("deliver_flow")))
        if io.get("fail_valid"):
            fx.append((c, 2, "fail", (io.get("fail_code"), io.get("fail_flow"),
                                      io.get("fail_peer"), io.get("fail_bytes"))))
        arming = io.get("arming")
        for i in range(3 * ports):
            if arming >> i & 1:
                fx.append((c, 1, "arm", i))

    if op.kind == "routes":  # the host loads the timing, the node and its routes
        while io.get("busy"):  # once the unit has cleared its route table
            yield from tick()
        t = u.timing
        for name, v in (("tuning_ns", t.tuning_ns), ("propagation_ns", t.propagation_ns),
                        ("request_timeout_ns", t.request_timeout_ns),
                        ("release_timeout_ns", t.release_timeout_ns),
                        ("lease_ns", t.lease_ns), ("max_retries", t.max_retries),
                        ("node_id", u.index[u.node]), ("tx_tready", 1)):
            io.set(name, v)
        io.set("route_we", 1)
        for dst, r in u.routes.items():
            io.set("route_dst", u.index[dst])
            io.set("route_valid", 1)
            io.set("route_port", u.ports.index(r.port))
            io.set("route_channel", r.channel)
            io.set("route_next", u.index[r.next_hop])
            yield from tick()
        io.set("route_we", 0)
    io.set("ts_ns", u.clock.now_ns())
    io.set("tag", u.tag)
    io.set("timers_en", 1 << op.port if op.kind == "timer" else 0)
    io.set("rx_receiving", u.receiving())
    if op.kind in ("frame", "submit"):
        valid, ready, data = {"frame": ("rx_tvalid", "rx_tready", "rx_tdata"),
                              "submit": ("submit_valid", "submit_ready", "submit_flow")}[op.kind]
        io.set(data, op.value)
        io.set(valid, 1)
        while not io.get(ready):
            yield from tick()
        yield from tick()
        io.set(valid, 0)
    elif op.kind in ("tx_done", "rx_done"):
        if op.kind == "rx_done":
            io.set("rx_done_flow", op.value << 32 * op.port)
            io.set("rx_done_bytes", op.extra << nbw * op.port)
        io.set(op.kind, 1 << op.port)
        yield from tick()
        io.set(op.kind, 0)
    while io.get("busy"):
        yield from tick()
    op.state = {k: io.get(k) for k in ("stats", "unexpected", "armed", "due", "granted_ok",
                                       "granted_key", "tx_state", "tx_queued")}


def _design(bounds: Bounds) -> Any:
    from oddl.fpga.gateware.control_unit import ControlUnitRTL

    return ControlUnitRTL(FRAME, nodes=bounds.nodes, txq=bounds.txq, rxq=bounds.rxq,
                          done=bounds.done, per_sender=bounds.per_sender)


class _Core:
    """One elaborated unit in Amaranth's simulator, reused by the next unit of the same
    bounds (reset to power-on): elaborating costs most of a second."""

    def __init__(self, bounds: Bounds) -> None:
        from amaranth.sim import Simulator

        self.dut = _design(bounds)
        self.sim = Simulator(self.dut)
        self.sim.add_clock(1 / CLOCK_HZ)
        self.sim.add_testbench(self._bench, background=True)
        self.owner: RtlControlUnit | None = None
        self.ops: deque[_Op] = deque()
        self.total = 0

    def reset(self) -> None:
        self.sim.reset()
        self.ops.clear()

    def run(self, op: _Op) -> _Op:
        self.ops.append(op)
        while not op.done:
            self.sim.advance()
        self.total += op.cycles
        return op

    async def _bench(self, ctx: Any) -> None:
        d = self.dut
        io = TestbenchPorts(ctx, d)
        nbw = d.frame.width("nbytes")
        while True:
            await ctx.tick()
            while self.ops:
                op = self.ops.popleft()
                assert self.owner is not None
                for _ in _drive(io, self.owner, op, d.ports, nbw):
                    await ctx.tick()
                op.done = True


_BUILT: dict[Bounds, tuple[Any, Path]] = {}  # per bounds: the design and its library


class _VCore:
    """The unit compiled by Verilator (fpga/gateware/verilated.py): a model of its own per
    unit (a fresh one is cheap; the library is built once a machine)."""

    def __init__(self, bounds: Bounds) -> None:
        from oddl.fpga.gateware import verilated

        if bounds not in _BUILT:
            dut = _design(bounds)
            _BUILT[bounds] = (dut, verilated.build(dut, "ctrl_unit"))
        self.dut, lib = _BUILT[bounds]
        self.model = verilated.Model(lib, self.dut)
        self.reset()
        self.owner: RtlControlUnit | None = None
        self.total = 0

    def reset(self) -> None:
        """Reset, and the one edge Amaranth's testbench waits for before its first event
        (so that both count the same cycles)."""
        self.model.reset()
        self.model.tick()

    def run(self, op: _Op) -> _Op:
        assert self.owner is not None
        m = self.model
        for _ in _drive(m, self.owner, op, self.dut.ports, self.dut.frame.width("nbytes")):
            m.tick()
        op.done = True
        self.total += op.cycles
        return op


SIMULATORS = ("amaranth", "verilator")
_CORES: dict[tuple[str, Bounds], list[_Core | _VCore]] = {}


def cycles_simulated() -> int:
    """Clock cycles simulated by every unit's core in this process."""
    return sum(c.total for cores in _CORES.values() for c in cores)


def prepare(bounds: Bounds, simulator: str, count: int) -> None:
    """`count` cores ready in the pool, so that no job pays for elaborating (or, for
    Verilator, loading) one when it starts: on a real-time loop that stall is a late
    heartbeat and a disturbed run."""
    cores = _CORES.setdefault((simulator, bounds), [])
    while sum(c.owner is None for c in cores) < count:
        core = _Core(bounds) if simulator == "amaranth" else _VCore(bounds)
        if isinstance(core, _Core):
            core.sim.advance()  # its testbench started (not left unawaited if never used)
        cores.append(core)


class RtlControlUnit:
    """A node's control unit as the RTL, with `ControlUnit`'s interface (submit, on_message,
    on_tx_done, on_rx_done, halt, stats, ...). `nodes`: the testbed's node names in index
    order (a frame names nodes by index)."""

    def __init__(self, node: str, clock: Clock, bus: Bus, onic: ONic,
                 routes: dict[str, Route], timing: Timing,
                 deliver: Callable[[Flow], None], fail: Callable[[Exception], None], *,
                 nodes: Sequence[str], bounds: Bounds | None = None,
                 simulator: str = "amaranth") -> None:
        require("gateware", "the RTL control unit (--control-model rtl)")
        bounds = bounds or Bounds.of(timing, len(nodes))  # the Python unit's, in `timing`
        if len(nodes) > bounds.nodes:
            raise ValueError(f"{len(nodes)} nodes: the unit's route table holds {bounds.nodes}")
        self.node, self.clock, self.bus, self.onic = node, clock, bus, onic
        self.routes, self.timing, self.deliver, self.fail = routes, timing, deliver, fail
        self.names = list(nodes)
        self.simulator = simulator
        self.index = {n: i for i, n in enumerate(self.names)}
        self.ports = tuple(onic.ports)
        self.halted = False
        self.trace: Tracer | None = None  # (the RTL keeps no timeline)
        self.tag = 0
        self.sent = 0
        # the decisions' latency in cycles: a REQUEST in to its GRANT out, a GRANT in to
        # the transfer engine's start (the laser's tune command)
        self.latency: dict[str, list[int]] = {"request_to_grant": [], "grant_to_start": []}
        self._timers: dict[int, Any] = {}
        self._state: dict[str, int] = {}
        self._frame = Framer(node, self.index, self.ports)  # (its drops are bad_frames too)
        cores = _CORES.setdefault((simulator, bounds), [])
        core = next((c for c in cores if c.owner is None), None)
        if core is None:
            core = _Core(bounds) if simulator == "amaranth" else _VCore(bounds)
            cores.append(core)
        else:
            core.reset()
        core.owner, self.core = self, core
        onic.attach(self)
        bus.attach(node, self.on_message)
        self._do(_Op("routes"))

    def release(self) -> None:
        """The core goes back to the pool (a unit of a world the checker dropped)."""
        if self.core.owner is self:
            self.core.owner = None

    # --- what the Python unit offers --------------------------------------------------------
    @property
    def stats(self) -> dict[str, int]:
        from oddl.fpga.gateware.control_unit import STATS

        word = self._state["stats"]
        out = {k: word >> 32 * i & 0xFFFFFFFF for i, k in enumerate(STATS)}
        out["bad_frames"] += self._frame.dropped
        if not out["bad_frames"]:  # the Python unit's counters, and this one when it counts
            del out["bad_frames"]
        return out

    @property
    def unexpected_rx(self) -> dict[str, int]:
        word = self._state["unexpected"]
        return {p: word >> 32 * i & 0xFFFFFFFF for i, p in enumerate(self.ports)}

    def _tx(self) -> list[tuple[int, int]]:
        """Each transmitter's (state, flows queued, the current one among them)."""
        s, q = self._state.get("tx_state", 0), self._state.get("tx_queued", 0)
        return [(s >> 2 * i & 3, q >> 16 * i & 0xFFFF) for i in range(len(self.ports))]

    def transmitting(self) -> bool:
        return any(state for state, _ in self._tx())

    def in_flight(self) -> int:
        return sum(bool(state) for state, _ in self._tx()) + \
            bin(self._state.get("granted_ok", 0)).count("1")

    def ports_view(self) -> dict[str, PortView]:
        """Each transmitter for the dashboard: its state and queue (the channel, flow and
        peer stay in the RTL)."""
        return {p: PortView(_SHOWN[state], queued=max(queued - 1, 0))  # type: ignore[arg-type]
                for p, (state, queued) in zip(self.ports, self._tx(), strict=True)}

    def receiving(self) -> int:
        """Per port, whether the granted flow's light is arriving (the receive path compares
        its current transfer with the grant)."""
        ok, keys = self._state.get("granted_ok", 0), self._state.get("granted_key", 0)
        fw, hw = FRAME.width("flow"), FRAME.width("hop")
        out = 0
        for i, p in enumerate(self.ports):
            k = keys >> (fw + hw) * i
            flow, hop = k & (1 << fw) - 1, k >> fw & (1 << hw) - 1
            if ok >> i & 1 and self.onic.rx_receiving(p, flow, hop):
                out |= 1 << i
        return out

    # --- events in --------------------------------------------------------------------------
    def submit(self, flow: Flow) -> None:
        if not self.halted:
            self._do(_Op("submit", value=self._flow_word(flow)))

    def on_message(self, m: ControlMessage) -> None:
        if self.halted:
            return
        if (word := self._frame(m)) is None:
            return
        self._do(_Op("frame", value=word))

    def on_tx_done(self, port: str, flow: Flow) -> None:
        if not self.halted:
            self._do(_Op("tx_done", self.ports.index(port)))

    def on_rx_done(self, port: str, flow_id_lo: int, nbytes: int) -> None:
        if not self.halted:
            self._do(_Op("rx_done", self.ports.index(port), flow_id_lo, nbytes))

    def _wake(self, i: int) -> None:
        self._timers.pop(i, None)
        if not self.halted:
            self._do(_Op("timer", i))

    def halt(self) -> None:
        """The job is over here: nothing more is heard, and the core goes back to the pool
        (what the unit counted stays readable)."""
        self.halted = True
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()
        self.release()

    # --- what the RTL did -------------------------------------------------------------------
    def _do(self, op: _Op) -> None:
        self.core.run(op)
        self._state = op.state
        armed, due = op.state["armed"], op.state["due"]
        for cycle, _, what, v in sorted(op.effects, key=lambda e: (e[0], e[1])):
            if what == "frame":
                msg = decode_frame(v, self.names, self.ports)
                if op.kind == "frame" and isinstance(msg, Grant):
                    self.latency["request_to_grant"].append(cycle)
                self.sent += 1
                self.bus.send(self.node, msg.dst, msg)
            elif what == "arm":
                old = self._timers.pop(v, None)
                if old is not None:
                    old.cancel()
                if armed >> v & 1:
                    self._timers[v] = self.clock.call_at_ns(
                        due >> 64 * v & (1 << 64) - 1, self._wake, v)
            elif what == "start":
                port, tune, channel, word = v
                self.latency["grant_to_start"].append(cycle)
                flow = self._flow(word)
                if tune:
                    self.onic.tune_and_send(self.ports[port], channel, flow)
                else:
                    self.onic.send(self.ports[port], flow)
            elif what == "deliver":
                self.deliver(self._flow(v))
            else:
                self.fail(self._failure(*v))
        for i in [i for i in self._timers if not armed >> i & 1]:
            self._timers.pop(i).cancel()

    def _flow_word(self, f: Flow) -> int:
        from oddl.fpga.frame import flow_word

        return flow_word(FRAME, f.id, self.index[f.src], self.index[f.dst], f.nbytes,
                         f.iteration, f.step, f.hop, f.t_submit)

    def _flow(self, word: int) -> Flow:
        from oddl.fpga.frame import flow_fields

        v = flow_fields(FRAME, word)
        return Flow(v["id"], self.names[v["src"]], self.names[v["dst"]], v["nbytes"],
                    v["iteration"], v["step"], v["hop"], v["t_submit"])

    def _failure(self, code: int, flow: int, peer: int, nbytes: int) -> FlowFailed:
        from oddl.fpga.gateware.control_unit import FAILS

        what = {v: k for k, v in FAILS.items()}.get(code, str(code))
        if what == "retries":
            return FlowFailed(f"{self.node}: flow {flow} via {self.names[peer]} got no GRANT "
                              f"after {self.timing.max_retries} retries", self.names[peer])
        if what == "no_route":
            return FlowFailed(f"{self.node}: no route to {self.names[peer]} for flow {flow}")
        if what == "short":
            return FlowFailed(f"{self.node}: flow {flow} arrived with {nbytes} bytes, not "
                              f"the granted size")
        return FlowFailed(f"{self.node}: flow {flow}: the transmitter's queue is full "
                          f"({what})")
