"""Stage 2 checked over every interleaving: the real `ControlUnit` code, driven by a
scheduler that owns delivery order, loss, duplication, delay and time.

This is explicit-state model checking in the manner of TLC, and FoundationDB's
deterministic simulation: nothing here re-models the protocol. The control units are the
ones a node runs (controller/stage2/control_unit.py), each on a model clock whose timers
are the scheduler's events, a bus whose messages wait in flight until the scheduler
delivers, drops or duplicates them, and an O-NIC model whose light takes its time. From
each state the scheduler tries every enabled event:
- deliver any message in flight (with `reorder`: any; without: the oldest per sender and
  receiver);
- lose one (`loss`) or deliver a copy and keep it (`dup`), within a budget per run;
- fire the earliest timer, which moves time on; a message in flight past its latency
  bound (`LATENCY_NS`) holds time back unless `delay` lets it arrive late (a budget too).
States are hashed (the units' protocol state, what is in flight, the timers, the light,
what was delivered), so each is expanded once. In every state it checks that no receiver
has two senders' light at once, that no transmitter starts while it tunes or sends, and
that no flow is delivered twice, and that without a fault on the way no hop is granted
twice; in every final state, that every flow was delivered or
the run ended with the named error after the bounded retries (no deadlock). A violation
comes with the shortest-known trace of events that leads to it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import pickle
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from oddl.controller.base.messages import ControlMessage, Flow, Grant, Release, Request, Wait
from oddl.controller.stage1.plan import Route
from oddl.controller.stage2.control_unit import ControlUnit, Timing

# the model's times (ns): small, so that the state space is too; their order is what counts
TIMING = Timing(tuning_ns=10, guard_ns=2, propagation_ns=5, request_timeout_ns=100,
                release_timeout_ns=100, lease_ns=60, max_retries=2)
LATENCY_NS = 10  # a control message arrives within this, unless delayed (`delay`)
BYTES_NS = 40  # a flow's transfer (of FLOW_BYTES)
FLOW_BYTES = 1000
# "two senders, one receiver": one sender's transfers (80 ns) end its grant at 95 ns, so
# the GRANT that answers the other's REQUEST (queued at 0) is in flight when that sender's
# first poll goes (its time-out, at 100 ns): the two cross
LONG_BYTES = 2000
FAULTS = ("loss", "dup", "reorder", "delay")
BUDGET = 1  # losses, duplicates and delays each, per run
_KIND = {Request: "REQUEST", Grant: "GRANT", Release: "RELEASE", Wait: "WAIT"}
_TIMERS = {"_request_timeout": "REQUEST time-out", "_lease_check": "lease check",
           "_release_overdue": "RELEASE overdue", "_tx_done": "transfer sent",
           "_lit": "light arrives", "_dark": "light received in full"}


# --- the environment the real control units run in --------------------------------------
class _Timer:
    __slots__ = ("args", "cancelled", "due", "fn", "seq")

    def __init__(self, due: int, seq: int, fn: Callable[..., None], args: tuple[Any, ...]
                 ) -> None:
        self.due, self.seq, self.fn, self.args, self.cancelled = due, seq, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _Timer) -> bool:
        return (self.due, self.seq) < (other.due, other.seq)


class _Clock:
    """What a control unit asks of its clock; each timer an event of the scheduler."""

    def __init__(self) -> None:
        self.now = 0
        self.heap: list[_Timer] = []
        self.seq = 0

    def now_ns(self) -> int:
        return self.now

    loop_ns = now_ns  # (virtual: a loop never late)

    def behind(self, _t_ns: int) -> bool:
        return False  # (each timer an event at its instant)

    def call_at_ns(self, t: int, fn: Callable[..., None], *args: Any) -> _Timer:
        self.seq += 1
        timer = _Timer(max(t, self.now), self.seq, fn, args)
        heapq.heappush(self.heap, timer)
        return timer

    def call_later_ns(self, d: int, fn: Callable[..., None], *args: Any) -> _Timer:
        return self.call_at_ns(self.now + d, fn, *args)

    def next(self) -> _Timer | None:
        while self.heap and self.heap[0].cancelled:
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else None


@dataclass
class _InFlight:
    src: str
    dst: str
    msg: ControlMessage
    deadline: int


class _Bus:
    def __init__(self, world: World) -> None:
        self.world = world
        self.handlers: dict[str, Callable[[ControlMessage], None]] = {}
        self.sent = 0

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None:
        self.handlers[node] = handler

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        w = self.world
        self.sent += 1
        if type(msg) is Grant:
            w.granted(msg)
        w.inflight.append(_InFlight(src, dst, msg, w.clock.now + LATENCY_NS))


class _ONic:
    """An O-NIC as the control unit sees it: a transfer tunes, then its light takes
    BYTES_NS and lands `propagation_ns` later on the receiver the channel reaches; busy
    transmitters and receivers lit twice are what the checker looks for."""

    def __init__(self, world: World, node: str) -> None:
        self.world, self.node = world, node
        self.ports = ("H", "V")
        self.tampered = 0
        self.on_module_fired = None
        self.events: Any = None
        self.busy: dict[str, int] = {}  # port -> the end of its transfer
        self.channel: dict[str, int | None] = dict.fromkeys(self.ports)
        self.arriving: dict[str, list[tuple[int, int]]] = {p: [] for p in self.ports}

    def attach(self, events: Any) -> None:
        self.events = events

    def send(self, port: str, flow: Flow) -> None:
        self._start(port, self.channel[port], 0, flow)

    def tune_and_send(self, port: str, channel: int, flow: Flow) -> None:
        self._start(port, channel, self.world.timing.tuning_ns, flow)

    def rx_receiving(self, port: str, flow: int, hop: int) -> bool:
        return (flow, hop) in self.arriving[port]

    def _start(self, port: str, channel: int | None, tune: int, flow: Flow) -> None:
        w = self.world
        now = w.clock.now
        if port in self.busy:
            w.violate(f"{self.node}/{port} starts flow {flow.id} hop {flow.hop} while it "
                      f"still tunes or sends (until t={self.busy[port]})")
            return
        dst = w.wire.get((self.node, port, channel)) if channel is not None else None
        if dst is None:
            w.violate(f"{self.node}/{port} sends flow {flow.id} on channel {channel}, "
                      f"which reaches no receiver")
            return
        self.channel[port] = channel
        start, end = now + tune, now + tune + w.transfer_ns(flow.nbytes)
        self.busy[port] = end
        prop = w.timing.propagation_ns
        rx = w.onics[dst]
        w.clock.call_at_ns(end, self._tx_done, port, flow)
        w.clock.call_at_ns(start + prop, rx._lit, port, flow)
        w.clock.call_at_ns(end + prop, rx._dark, port, flow)

    def _tx_done(self, port: str, flow: Flow) -> None:
        del self.busy[port]
        self.events.on_tx_done(port, flow)

    def _lit(self, port: str, flow: Flow) -> None:
        lit = self.arriving[port]
        if lit:
            self.world.violate(f"{self.node}/{port} receives flow {flow.id} hop {flow.hop} "
                               f"and flow {lit[0][0]} hop {lit[0][1]} at once: granted to "
                               f"two senders")
        lit.append((flow.id, flow.hop))

    def _dark(self, port: str, flow: Flow) -> None:
        self.arriving[port].remove((flow.id, flow.hop))
        self.events.on_rx_done(port, flow.id & 0xFFFFFFFF, flow.nbytes)


@dataclass(frozen=True)
class Config:
    """A small testbed: `nodes` in a row on one WSS (port H), and the flows, each a list
    of node names (a direct flow, or one relayed through the middle ones)."""

    name: str
    nodes: tuple[str, ...]
    flows: tuple[tuple[str, ...], ...]
    nbytes: tuple[int, ...] = ()  # each flow's size (default FLOW_BYTES)

    def describe(self) -> str:
        return f"{self.name}: " + ", ".join(
            "->".join(p) + (f" ({self.size(i)} B)" if self.size(i) != FLOW_BYTES else "")
            for i, p in enumerate(self.flows))

    def size(self, i: int) -> int:
        return self.nbytes[i] if i < len(self.nbytes) else FLOW_BYTES


def _fixed(nbytes: int) -> int:
    """A transfer's time: BYTES_NS for FLOW_BYTES, in proportion."""
    return BYTES_NS * nbytes // FLOW_BYTES


class World:
    """The control units of one configuration, their clock, bus and O-NICs: one state.
    `routes` and `transfer_ns` (a real job's, for a replay) stand in for the small
    testbed's; a configuration's flows are submitted at once (a replay's config has none:
    it submits each as the run did)."""

    def __init__(self, cfg: Config, faults: frozenset[str],
                 unit: type[ControlUnit] = ControlUnit, timing: Timing = TIMING,
                 routes: dict[str, dict[str, Route]] | None = None,
                 transfer_ns: Callable[[int], int] | None = None) -> None:
        self.cfg, self.faults, self.timing = cfg, faults, timing
        self.transfer_ns = transfer_ns or _fixed  # picklable: states are copied so
        self.clock = _Clock()
        self.bus = _Bus(self)
        self.inflight: list[_InFlight] = []
        self.budget = {f: BUDGET for f in ("loss", "dup", "delay") if f in faults}
        self.delivered: dict[int, int] = {}
        self.grants: dict[tuple[int, int], int] = {}  # GRANTs sent, per (flow, hop)
        # a fault happened on the way here (a loss, a copy, a late or reordered message):
        # a hop may then be granted again, once its lease has lapsed
        self.faulted = False
        self.violations: list[str] = []
        self.failed: str | None = None
        if routes is None:
            # the small testbed's WSS: from node i, channel (j - i) % n - 1 reaches node j
            n = len(cfg.nodes)
            pos = {x: i for i, x in enumerate(cfg.nodes)}
            routes = {x: {} for x in cfg.nodes}
            for path in cfg.flows:
                for k, hop in enumerate(path[:-1]):
                    nxt = path[k + 1]
                    routes[hop].setdefault(path[-1],
                                           Route("H", (pos[nxt] - pos[hop]) % n - 1, nxt))
        self.wire = {(a, r.port, r.channel): r.next_hop for a, rs in routes.items()
                     for r in rs.values()}
        self.onics = {x: _ONic(self, x) for x in cfg.nodes}
        # (type: ignore below: the model's bus and boards: duck-typed stand-ins)
        self.units = {x: unit(x, self.clock, self.bus, self.onics[x], routes.get(x, {}),  # type: ignore[arg-type]
                              timing, self._deliver, self._fail) for x in cfg.nodes}
        self.flows = [Flow(i + 1, p[0], p[-1], cfg.size(i)) for i, p in enumerate(cfg.flows)]
        for f in self.flows:
            self.units[f.src].submit(f)

    # what the units report
    def _deliver(self, flow: Flow) -> None:
        n = self.delivered[flow.id] = self.delivered.get(flow.id, 0) + 1
        if n > 1:
            self.violate(f"flow {flow.id} delivered {n} times")

    def _fail(self, e: Exception) -> None:
        if self.failed is None:
            self.failed = str(e)
            for u in self.units.values():
                u.halt()

    def violate(self, what: str) -> None:
        self.violations.append(f"t={self.clock.now}: {what}")

    def granted(self, g: Grant) -> None:
        """Without faults, one GRANT a hop: a second is a receiver that took a repeated
        REQUEST (a poll that crossed its GRANT) for a lost GRANT."""
        n = self.grants[(g.flow, g.hop)] = self.grants.get((g.flow, g.hop), 0) + 1
        if n > 1 and not self.faulted:
            self.violate(f"flow {g.flow} hop {g.hop} granted {n} times without a fault "
                         f"(one GRANT a hop)")

    # --- the scheduler's events ---------------------------------------------------------
    def events(self) -> list[tuple[str, int]]:
        """Every event enabled here: (kind, in-flight index) or ("tick", -1)."""
        if self.violations or self.failed is not None:
            return []
        out: list[tuple[str, int]] = []
        seen: set[tuple[str, str, str]] = set()
        oldest: dict[tuple[str, str], int] = {}
        for i, m in enumerate(self.inflight):
            oldest.setdefault((m.src, m.dst), i)
        for i, m in enumerate(self.inflight):
            key = (m.src, m.dst, repr(m.msg))
            if key in seen:
                continue  # two copies of one message: one choice
            seen.add(key)
            if "reorder" in self.faults or oldest[(m.src, m.dst)] == i:
                out.append(("deliver", i))
            if self.budget.get("loss"):
                out.append(("lose", i))
            if self.budget.get("dup"):
                out.append(("dup", i))
        t = self.clock.next()
        if t is not None:
            late = any(m.deadline < t.due for m in self.inflight)
            if not late or self.budget.get("delay"):
                out.append(("tick", -1))
        return out

    def do(self, kind: str, i: int) -> str:
        """Apply one event; returns what happened, for a trace."""
        if kind == "tick":
            t = self.clock.next()
            assert t is not None
            if any(m.deadline < t.due for m in self.inflight):
                self.budget["delay"] -= 1
                self.faulted = True
            return self.fire()
        m = self.inflight[i]
        what = f"{_KIND[type(m.msg)]} {m.src}->{m.dst} flow {m.msg.flow} hop {m.msg.hop}"
        if kind != "deliver" or any((o.src, o.dst) == (m.src, m.dst)
                                    for o in self.inflight[:i]):
            self.faulted = True  # lost, copied, or overtaking an older one on its way
        if kind == "lose":
            self.budget["loss"] -= 1
            del self.inflight[i]
            return f"t={self.clock.now}: lost {what}"
        if kind == "dup":
            self.budget["dup"] -= 1
        else:
            del self.inflight[i]
        self.bus.handlers[m.dst](m.msg)
        late = " (late)" if m.deadline < self.clock.now else ""
        return f"t={self.clock.now}: {what}{' (a copy)' if kind == 'dup' else late}"

    def fire(self) -> str:
        """The earliest timer fires: time moves to it."""
        t = heapq.heappop(self.clock.heap)
        self.clock.now = t.due
        t.fn(*t.args)
        return f"t={t.due}: {_owner(t.fn)}: {_TIMERS.get(t.fn.__name__, t.fn.__name__)}" \
            + "".join(f" (flow {a.id} hop {a.hop})" for a in t.args if isinstance(a, Flow))

    def done(self) -> bool:
        return self.failed is not None or len(self.delivered) == len(self.flows)

    def key(self) -> tuple[Any, ...]:
        """What distinguishes this state from another (statistics and logs aside)."""
        units: list[tuple[object, ...]] = []
        for x, u in sorted(self.units.items()):
            units.append((x, u.halted))
            for p in ("H", "V"):
                tx, rx = u.tx[p], u.rx[p]
                units.append((tx.state, tx.channel, repr(tx.current), tuple(map(repr, tx.queue)),
                              tx.retries, repr(rx.granted), tuple(map(repr, rx.queue)),
                              tuple(sorted(rx.done)), rx.data_done, rx.released,
                              rx.asked))
        timers = tuple(sorted((t.due, _owner(t.fn), t.fn.__name__, _args(t.args))
                              for t in self.clock.heap if not t.cancelled))
        flight = tuple(sorted((m.src, m.dst, repr(m.msg), m.deadline) for m in self.inflight))
        light = tuple((x, tuple(sorted(o.busy.items())), tuple(o.channel.values()),
                       tuple(map(tuple, o.arriving.values())))
                      for x, o in sorted(self.onics.items()))
        return (self.clock.now, tuple(units), timers, flight, light,
                tuple(sorted(self.delivered.items())), tuple(sorted(self.budget.items())),
                tuple(sorted(self.grants.items())), self.faulted, self.failed)


def _owner(fn: Callable[..., Any]) -> str:
    return getattr(getattr(fn, "__self__", None), "node", "?")


def _args(args: tuple[Any, ...]) -> tuple[str, ...]:
    """A timer's arguments by value: a unit's transmitter or receiver by its port."""
    return tuple(f"{type(a).__name__} {a.port}" if type(a).__name__ in ("_Tx", "_Rx")
                 else repr(a) for a in args)


# --- the search ------------------------------------------------------------------------
@dataclass
class Verdict:
    config: str
    states: int
    finals: int  # final states: every flow delivered, or the named error
    failed_named: int  # of which, ended with a flow's named error after its retries
    violations: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True  # every reachable state explored (not cut by max_states)


def explore(cfg: Config, faults: Iterable[str] = FAULTS, unit: type[ControlUnit] = ControlUnit,
            max_states: int = 2_000_000, max_violations: int = 1) -> Verdict:
    """Every distinguishable interleaving of `cfg` under `faults`, depth first."""
    faults = frozenset(faults)
    unknown = faults - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)} (of {', '.join(FAULTS)})")
    root = World(cfg, faults, unit)
    verdict = Verdict(cfg.describe(), 0, 0, 0)
    seen: set[int] = set()
    # each entry: a state, and the trace that reached it
    stack: list[tuple[World, tuple[str, ...]]] = [(root, ())]
    while stack:
        w, trace = stack.pop()
        h = hash(w.key())
        if h in seen:
            continue
        seen.add(h)
        verdict.states += 1
        if w.violations:
            verdict.violations.append({"violation": w.violations[0], "trace": list(trace)})
            if len(verdict.violations) >= max_violations:
                return verdict
            continue
        evs = w.events()
        if not evs:
            if w.done():
                verdict.finals += 1
                verdict.failed_named += w.failed is not None
            else:
                missing = [f.id for f in w.flows if f.id not in w.delivered]
                verdict.violations.append({"violation": f"t={w.clock.now}: deadlock: flows "
                                           f"{missing} undelivered and nothing left to happen",
                                           "trace": list(trace)})
                if len(verdict.violations) >= max_violations:
                    return verdict
            continue
        if verdict.states >= max_states:
            verdict.complete = False
            break
        w.clock.heap = [t for t in w.clock.heap if not t.cancelled]  # not copied on
        heapq.heapify(w.clock.heap)
        frozen = pickle.dumps(w, pickle.HIGHEST_PROTOCOL) if len(evs) > 1 else b""
        for j, (kind, i) in enumerate(evs):
            # a copy of the state per event (in memory, never on a network path; pickle is
            # 5x faster than deepcopy here); the last event takes the state itself
            nxt = w if j == len(evs) - 1 else pickle.loads(frozen)
            step = nxt.do(kind, i)
            stack.append((nxt, (*trace, step)))
    return verdict


def configurations(nodes: int, flows: int) -> list[Config]:
    """The small configurations the issue names, within `nodes` nodes and `flows` flows a
    sender: one flow; two senders to one receiver; a relay hop beside a direct flow to the
    same receiver; a ring of four."""
    names = ("n0", "n1", "n2", "n3")
    out = [Config("one flow", names[:2], (("n0", "n1"),) * flows),
           Config("two senders, one receiver", names[:3],
                  (("n0", "n2"),) * flows + (("n1", "n2"),) * flows,
                  (LONG_BYTES,) * flows),
           Config("a relay hop", names[:3],
                  (("n0", "n1", "n2"),) * flows + (("n1", "n2"),) * min(flows, 1)),
           Config("a ring of four", names[:4],
                  tuple((a, b) for a, b in itertools.pairwise((*names, names[0])))
                  * flows)]
    return [c for c in out if len(c.nodes) <= nodes]


def verify(nodes: int = 3, flows: int = 1, faults: Iterable[str] = FAULTS,
           unit: type[ControlUnit] = ControlUnit, max_states: int = 2_000_000
           ) -> dict[str, Any]:
    """`oddl verify stage2`: every configuration explored; what `--json` prints."""
    t0 = time.perf_counter()
    quiet = logging.getLogger("oddl.controller.stage2")  # strays, by the thousand: expected
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        verdicts = [explore(c, faults, unit, max_states) for c in configurations(nodes, flows)]
    finally:
        quiet.setLevel(level)
    return {"configurations": [v.__dict__ for v in verdicts],
            "states": sum(v.states for v in verdicts),
            "violations": sum(len(v.violations) for v in verdicts),
            "seconds": round(time.perf_counter() - t0, 2)}


# --- conformance: a recorded run replayed through the model ------------------------------
Delivery = tuple[str, str, str, int, int]  # receiver, sender, REQUEST/GRANT/..., flow, hop


@dataclass
class Conformance:
    messages: int  # deliveries replayed, in the order the run recorded them
    conformant: bool
    why: str = ""
    timers: int = 0  # model timers fired between them (time moving on)
    left_in_flight: int = 0  # messages the model sent that the run never delivered


def replay(deliveries: list[Delivery], nodes: Iterable[str],
           routes: dict[str, dict[str, Route]], flows: dict[int, Flow], timing: Timing,
           transfer_ns: Callable[[int], int], max_timers: int = 100_000) -> Conformance:
    """Whether a run's recorded deliveries are a behaviour of the model: each one, in the
    recorded order, must be a message the model's units have in flight by then, firing
    the model's timers (time moving on) until it is; a flow enters when its first REQUEST
    does (the collective engine, which submits it, is outside the model). At the end every
    flow that entered is delivered once, and no property is broken on the way.

    Time moves on only when a delivery needs it, and that can be too late: a REQUEST
    retried before its GRANT arrived, but delivered after it (a loaded host), is sent only
    if the time-out fires before that GRANT is delivered. So a message the model cannot
    send where the record has it is sought earlier too: time moved on, before one of the
    BACKTRACK deliveries before it, until the model has sent it."""
    early: dict[int, Delivery] = {}  # before delivery j: time moves on until this is sent
    sought: set[int] = set()  # the deliveries sought earlier already
    while True:
        v, k = _replay(deliveries, nodes, routes, flows, timing, transfer_ns, max_timers,
                       early)
        if v.conformant or k is None or k in sought:
            return v
        sought.add(k)
        for j in range(k - 1, max(k - BACKTRACK, 0) - 1, -1):
            if j in early:
                continue
            tried = {**early, j: deliveries[k]}
            w, k2 = _replay(deliveries, nodes, routes, flows, timing, transfer_ns,
                            max_timers, tried)
            if w.conformant or (k2 is not None and k2 > k):  # past it: so it went
                early = tried
                break
        else:
            return v


BACKTRACK = 8  # deliveries: how far back a message may have been sent before its turn


def _replay(deliveries: list[Delivery], nodes: Iterable[str],
            routes: dict[str, dict[str, Route]], flows: dict[int, Flow], timing: Timing,
            transfer_ns: Callable[[int], int], max_timers: int,
            early: dict[int, Delivery]) -> tuple[Conformance, int | None]:
    """One replay (`replay`), moving time on before delivery j until `early[j]` is sent;
    with the index of the delivery the model could not send, if that is why it failed."""
    w = World(Config("replay", tuple(nodes), ()), frozenset({"reorder"}), timing=timing,
              routes=routes, transfer_ns=transfer_ns)
    w.faulted = True  # a run's own timing (a lease may lapse on a loaded host): the
    # record is held to the model's behaviours, not to its fault-free ones
    entered: set[int] = set()
    fired = 0

    def sent(d: Delivery) -> int | None:
        return next((i for i, m in enumerate(w.inflight)
                     if (m.dst, m.src, _KIND[type(m.msg)], m.msg.flow, m.msg.hop) == d), None)

    def broken() -> str | None:  # the model's first violation, or its failure
        return w.violations[0] if w.violations else w.failed

    for k, d in enumerate(deliveries):
        dst, src, kind, flow, hop = d
        here = f"delivery {k} ({kind} {src}->{dst} flow {flow} hop {hop})"
        if kind == "REQUEST" and hop == 0 and flow not in entered:
            f = flows.get(flow)
            if f is None or f.src != src:
                return Conformance(k, False, f"{here}: no flow of the job starts so",
                                   fired), None
            entered.add(flow)
            w.units[src].submit(Flow(f.id, f.src, f.dst, f.nbytes, f.iteration, f.step))
        want = early.get(k)
        while want is not None and sent(want) is None and broken() is None \
                and w.clock.next() is not None and fired < max_timers:
            w.fire()
            fired += 1
        if (why := broken()) is not None:
            return Conformance(k, False, f"{here}: {why}", fired), None
        while (i := sent(d)) is None:
            # time moving on, seeking it, may run out, or into a failure (a flow whose
            # GRANT the record has next runs out of retries): either way it was not sent
            # by here, and may be sought earlier
            if (why := broken()) is not None:
                return Conformance(k, False, f"{here}: {why}", fired), k
            if w.clock.next() is None or fired >= max_timers:
                return Conformance(k, False, f"{here}: the model never sends it", fired), k
            w.fire()
            fired += 1
        w.do("deliver", i)
    while w.clock.next() is not None and fired < max_timers and not w.violations:
        w.fire()  # the last transfers land
        fired += 1
    n = len(deliveries)
    if w.violations:
        return Conformance(n, False, w.violations[0], fired), None
    missing = sorted(entered - set(w.delivered))
    if missing:
        return Conformance(n, False, f"flows {missing[:5]} entered and were never delivered",
                           fired), None
    return Conformance(n, True, "", fired, len(w.inflight)), None
