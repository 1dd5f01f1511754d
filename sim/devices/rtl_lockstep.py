"""The RTL control unit held to the Python one: the model checker's worlds
(controller/stage2/verify.py), each run twice in lockstep, once with `ControlUnit` on every
node and once with the RTL: by default the whole O-NIC, `onic_top`, its unit reached only
through the top's ports (sim/devices/rtl_board.py), as a host reaches it (the register
driver's `GatewareUnit`: routes, flows and deliveries by registers, an interrupt), as the
network does (control frames on its MAC-facing stream) and as the optics do (the tuning
sequencer's and the transfer engine's pins); or the unit alone behind its own harness
(`design="unit"`, sim/devices/rtl_control_unit.py).

A walk follows one path of the checker's state space: at each step it picks one of the
events enabled in the Python world (a message delivered, lost, duplicated or late; the
earliest timer), applies the same event, chosen by what it is, to the RTL world, and with
`forge` sometimes injects what no well-behaved peer sends (a REQUEST, GRANT, RELEASE or WAIT
of a flow that is not current, another job's, for the other port; a transfer reported that
was never granted, or short). After every step the two worlds must agree: the messages in
flight, the flows delivered, a failure, every unit's counters, every O-NIC's transfers
(tunes, channels, light), and when each node's timers are due. The first disagreement ends
the walk and is returned.
"""

from __future__ import annotations

import functools
import pickle
import random
from dataclasses import dataclass
from typing import Any

from oddl.controller.base.messages import ControlMessage, Flow, Grant, Release, Request, Wait
from oddl.controller.stage1.plan import Route
from oddl.controller.stage2 import verify as V
from oddl.controller.stage2.control_unit import Timing
from oddl.controller.stage2.invariants import TAG_SHIFT
from oddl.sim.devices import rtl_board, rtl_control_unit
from oddl.sim.devices.rtl_control_unit import RtlControlUnit

DESIGNS = ("top", "unit")  # what the RTL world runs: the whole O-NIC, or the unit alone

FORGE_EVERY = 6  # a forged event about once in this many steps, when forging


@dataclass
class Walks:
    walks: int = 0
    steps: int = 0
    forged: int = 0
    finals: int = 0  # walks that reached a final state (every flow delivered, or failed)
    failed_named: int = 0
    cycles: int = 0
    differences: list[str] | None = None


def _what(w: V.World, ev: tuple[str, int]) -> tuple[Any, ...]:
    kind, i = ev
    if kind == "tick":
        return ("tick",)
    m = w.inflight[i]
    return (kind, m.src, m.dst, repr(m.msg))


def _state(w: V.World) -> tuple[Any, ...]:
    return (w.clock.now,
            sorted((m.src, m.dst, repr(m.msg), m.deadline) for m in w.inflight),
            sorted(w.delivered.items()), w.failed is None, list(w.violations),
            {x: {k: v for k, v in u.stats.items() if k != "bad_frames"}
             for x, u in sorted(w.units.items())},
            {x: dict(u.unexpected_rx) for x, u in sorted(w.units.items())},
            # the O-NICs: which ports send until when, on which channel, what light arrives
            [(x, sorted(o.busy.items()), dict(o.channel), {p: list(a) for p, a in
                                                          o.arriving.items()})
             for x, o in sorted(w.onics.items())],
            sorted((t.due, V._owner(t.fn)) for t in w.clock.heap if not t.cancelled))


def _forgery(w: V.World, rnd: random.Random) -> tuple[str, Any]:
    nodes = w.cfg.nodes
    ids = [f.id for f in w.flows] + [99, 1 << TAG_SHIFT | 1]
    flow, hop = rnd.choice(ids), rnd.randrange(2)
    src, dst = rnd.choice(nodes), rnd.choice(nodes)
    port = rnd.choice(("H", "V"))
    if rnd.randrange(5) == 0:
        return ("rx_done", (dst, port, flow & 0xFFFFFFFF, rnd.choice((1000, 999))))
    kind = rnd.randrange(4)
    msg: ControlMessage
    if kind == 0:
        msg = Request(flow, hop, src, dst, port, rnd.randrange(3), 1000, src,
                      rnd.choice(nodes))
    elif kind == 1:
        msg = Grant(flow, hop, src, dst, port, rnd.randrange(3),
                    w.clock.now + rnd.choice((0, 30, 100)))
    elif kind == 2:
        msg = Release(flow, hop, src, dst, port)
    else:
        msg = Wait(flow, hop, src, dst, port, rnd.randrange(4))
    return ("message", msg)


def _apply_forgery(w: V.World, what: tuple[str, Any]) -> None:
    kind, v = what
    if kind == "message":
        w.bus.handlers[v.dst](v)
    else:  # a completion, as the O-NIC reports one
        node, port, lo, nbytes = v
        w.onics[node].events.on_rx_done(port, lo, nbytes)


def _cycles() -> int:
    return rtl_control_unit.cycles_simulated() + rtl_board.cycles_simulated()


class _RxView:
    """A receiver as the board reads its pins: the light arriving now, if any."""

    def __init__(self, onic: V._ONic, port: str) -> None:
        self.onic, self.port = onic, port
        self.src: str | None = None  # (not known here: the flow's source stands in)
        self.errors = 0

    @property
    def current(self) -> Flow | None:
        lit = self.onic.arriving[self.port]
        return Flow(lit[0][0], self.onic.node, self.onic.node, 0, hop=lit[0][1]) \
            if lit else None


class _Optics:
    """The checker's O-NIC of one node as the fabric the RTL board drives (the laser driver
    and the transfer engine): a tune is locked at once, and the transfer that follows it
    is the O-NIC's `tune_and_send` (its model times the tuning); one on the channel held,
    its `send`. Its completions come back as the transfer engine's strobes. The checker's
    O-NIC has no channel count (a channel that reaches no receiver is its violation, not
    a refusal), so the laser's strap is the most the strap can say."""

    n_channels = 255

    def __init__(self, onic: V._ONic) -> None:
        self.onic, self.node = onic, onic.node
        self.clock = onic.world.clock
        self.ports = {self.node: onic.ports}
        self.rx = {(self.node, p): _RxView(onic, p) for p in onic.ports}
        self.rx_handlers: dict[str, Any] = {}
        self.tx_handlers: dict[str, Any] = {}
        self.tuned_handlers: dict[str, Any] = {}
        self._tuned: dict[str, int] = {}  # per port, the channel a transfer will tune to
        onic.attach(self)

    def tune(self, node: str, port: str, channel: int) -> None:
        self._tuned[port] = channel
        self.tuned_handlers[node](port, channel)

    def send(self, node: str, port: str, flow: Flow) -> None:
        channel = self._tuned.pop(port, None)
        if channel is None:
            self.onic.send(port, flow)
        else:
            self.onic.tune_and_send(port, channel, flow)

    def on_tx_done(self, port: str, flow: Flow) -> None:
        self.tx_handlers[self.node](port, flow)

    def on_rx_done(self, port: str, flow_id_lo: int, nbytes: int) -> None:
        self.rx_handlers[self.node](port, Flow(flow_id_lo, self.node, self.node, nbytes))


def _top_unit(node: str, clock: Any, bus: Any, onic: V._ONic, routes: dict[str, Route],
              timing: Timing, deliver: Any, fail: Any, *, nodes: tuple[str, ...],
              simulator: str, boards: list[rtl_board.RtlBoard]) -> Any:
    """A node's unit in its board's `onic_top`, as the checker's world holds a unit: the
    board on the world's O-NIC and control network (kept in `boards`, to be closed), the
    host's `GatewareUnit` over the register driver (its interrupt line the board's)."""
    import pynq
    from oddl.drivers.onic import DriverONic, ONicDriver
    from oddl.drivers.onic_unit import GatewareUnit
    from oddl.fpga import regmap as R
    from oddl.sim.devices.pynq_device import BASE_ADDR, EmulatedONicDevice

    index = {n: i for i, n in enumerate(nodes)}
    board = rtl_board.RtlBoard(_Optics(onic), node, index, list(nodes),  # type: ignore[arg-type]
                               simulator=simulator, unit=(bus, timing))
    mmio = pynq.MMIO(BASE_ADDR, R.IP_RANGE, device=EmulatedONicDevice(board))  # type: ignore[arg-type]
    donic = DriverONic(ONicDriver(mmio, node, list(nodes), index), onic.ports)
    board.on_irq = donic.on_interrupt
    boards.append(board)
    return GatewareUnit(node, clock, bus, donic, routes, timing, deliver, fail)


class _Pair:
    """One configuration's two worlds, Python and RTL, stepped together."""

    def __init__(self, cfg: V.Config, faults: frozenset[str], simulator: str,
                 design: str = "top") -> None:
        if design not in DESIGNS:
            raise ValueError(f"design {design!r}: one of {', '.join(DESIGNS)}")
        self.cfg = cfg
        self.py = V.World(cfg, faults)
        self.boards: list[rtl_board.RtlBoard] = []
        unit: Any = functools.partial(_top_unit, boards=self.boards) if design == "top" \
            else RtlControlUnit
        self.rtl = V.World(cfg, faults, functools.partial(  # type: ignore[arg-type]
            unit, nodes=cfg.nodes, simulator=simulator))

    def close(self) -> None:
        """The RTL cores go back to their pools."""
        for b in self.boards:
            b.close()
        for u in self.rtl.units.values():
            if isinstance(u, RtlControlUnit):
                u.release()

    def difference(self) -> str | None:
        a, b = _state(self.py), _state(self.rtl)
        if a == b:
            return None
        return "\n".join(f"  {k}: python {x!r}, rtl {y!r}" for k, x, y in zip(
            ("time", "in flight", "delivered", "running", "violations", "counters",
             "unexpected", "O-NICs", "timers"), a, b, strict=True) if x != y)

    def step(self, want: tuple[Any, ...]) -> str | None:
        """The event `want` (as `_what` names it) in both worlds; None, or why not."""
        for w in (self.py, self.rtl):
            match = [e for e in w.events() if _what(w, e) == want]
            if not match:
                return f"the {'RTL' if w is self.rtl else 'Python'} world cannot {want}"
            w.do(*match[0])
        return None


def walk(cfg: V.Config, faults: frozenset[str], seed: int, forge: bool = False,
         max_steps: int = 600, simulator: str = "amaranth", design: str = "top"
         ) -> tuple[str | None, int, int, V.World]:
    """One walk: (the first difference or None, steps, forged events, the Python world)."""
    rnd = random.Random(seed)
    pair, forged = _Pair(cfg, faults, simulator, design), 0
    py = pair.py
    try:
        for n in range(max_steps):
            diff = pair.difference()
            if diff is None and forge and py.failed is None and rnd.randrange(FORGE_EVERY) == 0:
                what = _forgery(py, rnd)
                _apply_forgery(py, what)
                _apply_forgery(pair.rtl, what)
                forged += 1
                continue
            evs = py.events() if diff is None else []
            if diff is None and evs:
                diff = pair.step(_what(py, rnd.choice(evs)))
            if diff is not None:
                return f"{cfg.name}, seed {seed}, step {n}:\n{diff}", n, forged, py
            if not evs:
                return None, n, forged, py
        return None, max_steps, forged, py
    finally:
        pair.close()


def paths(cfg: V.Config, faults: frozenset[str], max_states: int = 20_000
          ) -> list[tuple[tuple[Any, ...], ...]]:
    """Every state the checker reaches, as the events that lead to it from the start; only
    the longest paths are kept (every other is a prefix of one of them)."""
    seen: set[int] = set()
    found: list[tuple[tuple[Any, ...], ...]] = []
    stack: list[tuple[V.World, tuple[tuple[Any, ...], ...]]] = [(V.World(cfg, faults), ())]
    while stack and len(seen) < max_states:
        w, path = stack.pop()
        h = hash(w.key())
        if h in seen:
            continue
        seen.add(h)
        found.append(path)
        evs = [] if w.violations else w.events()
        for j, ev in enumerate(evs):
            nxt = w if j == len(evs) - 1 else pickle.loads(pickle.dumps(w))
            want = _what(nxt, ev)
            nxt.do(*ev)
            stack.append((nxt, (*path, want)))
    parents = {p[:-1] for p in found if p}
    return [p for p in found if p not in parents]


def replay(cfg: V.Config, faults: frozenset[str], path: tuple[tuple[Any, ...], ...],
           simulator: str = "amaranth", design: str = "top") -> str | None:
    """One path of the checker's in both worlds: None, or the first difference."""
    pair = _Pair(cfg, faults, simulator, design)
    try:
        for n, want in enumerate(path):
            diff = pair.difference() or pair.step(want)
            if diff is not None:
                return f"{cfg.name}, step {n} of {list(path)}:\n{diff}"
        return pair.difference()
    finally:
        pair.close()


def walks(nodes: int = 4, flows: int = 2, seeds: int = 20, forge: bool = False,
          faults: frozenset[str] = frozenset(V.FAULTS), first_seed: int = 0,
          simulator: str = "amaranth", design: str = "top") -> Walks:
    """`seeds` walks of each of the checker's configurations (`oddl verify stage2 --rtl`)."""
    out = Walks(differences=[])
    c0 = _cycles()
    for cfg in V.configurations(nodes, flows):
        for seed in range(first_seed, first_seed + seeds):  # a sample of the paths
            diff, steps, forged, py = walk(cfg, faults, seed, forge, simulator=simulator,
                                           design=design)
            out.walks += 1
            out.steps += steps
            out.forged += forged
            if diff is not None:
                assert out.differences is not None
                out.differences.append(diff)
            elif py.done():
                out.finals += 1
                out.failed_named += py.failed is not None
    out.cycles = _cycles() - c0
    return out


def every_path(nodes: int = 2, flows: int = 1, faults: frozenset[str] = frozenset(V.FAULTS),
               simulator: str = "amaranth", design: str = "top") -> Walks:
    """Every state of the checker's small configurations, reached in the RTL world by the
    same events (`oddl verify stage2 --rtl --every`): the paths to all of them replayed."""
    out = Walks(differences=[])
    c0 = _cycles()
    for cfg in V.configurations(nodes, flows):
        for path in paths(cfg, faults):
            diff = replay(cfg, faults, path, simulator, design)
            out.walks += 1
            out.steps += len(path)
            if diff is not None:
                assert out.differences is not None
                out.differences.append(diff)
    out.cycles = _cycles() - c0
    return out
