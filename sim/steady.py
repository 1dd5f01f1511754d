"""Exact steady state: a job's repeated iteration found, and extended to the job's end.

A model run is deterministic: what happens from an instant on is decided by the state at
that instant. Most runs reach an iteration that repeats (Table 1: every one after the
first), and simulating 25,000 copies of it teaches nothing. This module says when the
state repeats, and the back end then writes the copies instead of simulating them.

**The key.** At a *probe*, the instant iteration i's compute ends (before any rank of it
sends: the probe is scheduled first for that instant), the key is everything that decides
what happens next, relative to that instant: the pending model events in order (each
one's delay, callback and arguments) and every field of the back end's models (boards
and their registers, fabric, bus, WSSs, control units, the job's engine), less what
cannot decide a flow, which is listed here with the reason (`NOT_STATE`, `REGISTERS`):

- *counts* (bytes, transfers, fires, messages sent, statistics) are only ever added to and
  reported: no decision reads them;
- *labels* (flow ids, iteration numbers, the keys of delivered flows) are compared for
  equality only (a GRANT finds its REQUEST by flow id; a key is looked up only for a
  duplicate, which a clean run has none of), and each iteration's are new;
- *times* (absolute ns) enter the key as their distance from the probe; one read only as
  `now < t` (a tune's end) as that while it is to come, and as "passed" once it has; one
  read only as a duration (a tune's start), as that duration (a flow's submit time,
  carried in its REQUEST and its header and written down with it, is a label);
- *observers* (the invariant checker; the health watch's heartbeats, ticks and stall
  guard) read the models and raise on a violation or a fault, and write nothing a flow
  reads; their pending ticks are left out of the key (their phase drifts against the
  iteration's).

Two probes with equal keys, of iterations k and k + 1, mean that everything after the
second happens as after the first, shifted by the time between them: iteration k + 1 and
every later one last as long, carry as many messages and add the same counts. What is not
in the key cannot change that: it is never read by a decision (counts, labels), or read
only relative to now (times), or only watched (observers), and in a clean run the watchers
find nothing (a fault they would find is a fault of the models, which repeat). What the
back end cannot see is the run's: a drill's fault still to come, another job, a pause, a
time limit, a trace; the orchestration extends only a job with none of
those (`controller/service/admission.py`), and the back end only while its drill has
nothing left to begin and the watch has had `missed` + 1 periods since the last fault
began or ended (its evidence can wait in a register for the next heartbeat). Anything
the walk does not know how to key stops the search for that job: the run goes on in full.

The probes are taken in pairs, at the job's iterations 2 and 3, 4 and 5, 8 and 9, ...
(a run that never repeats pays for a few dozen walks).
"""

from __future__ import annotations

import array
import collections
import dataclasses
import enum
import functools
import random
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from oddl.controller.service.backend import FlowRow, Iteration, JobOutcome, Repeats
from oddl.fpga import regmap as R
from oddl.sim.clock import VirtualClockLoop

COUNT, LABEL = "count", "label"

# (class, field) -> why it is not in the key; fields of these kinds, "time", enter it
# relative to the probe
NOT_STATE: dict[tuple[str, str], str] = {
    ("CollectiveEngine", "flows"): COUNT,
    ("CollectiveEngine", "iteration"): LABEL,
    ("CollectiveEngine", "seq"): LABEL,  # each rank's flow ids
    ("ControlUnit", "sent"): COUNT,
    ("ControlUnit", "stats"): COUNT,
    ("_Rx", "done"): LABEL,  # delivered flows' keys: a duplicate is looked up in them
    ("_Rx", "done_order"): LABEL,
    ("_CAModule", "fire_count"): COUNT,
    ("ONicBoard", "fires"): COUNT,
    ("ONicBoard", "ts_hi_latch"): LABEL,  # a timestamp's high word, read with its low one
    ("Fabric", "bytes"): COUNT,
    ("Fabric", "transfers"): COUNT,
    ("Fabric", "lost"): COUNT,
    ("Transmitter", "sent_bytes"): COUNT,
    ("Transmitter", "tunes"): COUNT,
    ("Receiver", "rx_bytes"): COUNT,
    ("LocalBus", "sent"): COUNT,
    ("LocalBus", "delayed"): COUNT,
    ("LocalBus", "dropped"): COUNT,
    ("FlowNetwork", "flows"): COUNT,
}
# (class, field) -> how an absolute time (ns) enters the key: MARK, its distance from now;
# DEADLINE, that too while it is to come, and only "passed" once it has (it is read as
# `now < t`); or another field's name: its distance from that time (a duration)
MARK, DEADLINE = "mark", "deadline"
TIMES: dict[tuple[str, str], str] = {
    ("CollectiveEngine", "t_start"): MARK, ("CollectiveEngine", "t_done"): MARK,
    ("_Tx", "since"): DEADLINE,  # (a transmitter shows as tuning until it)
    ("Transmitter", "tune_until"): DEADLINE,
    ("Transmitter", "tune_from"): "tune_until",  # read only as the tune's duration
}
# classes left out wherever they are reached: observers (the checker, the health watch,
# a trace, the bus's watchers' announcer); the clock (keyed as its events); the back ends
# themselves, reached through their callbacks (their models are the roots; the rest of
# theirs is the run's: a drill, CASSINI's pauses, the watch)
SKIP_CLASSES = frozenset({"InvariantChecker", "Health", "Heartbeats", "Watch", "Tracer",
                          "BusAnnouncer", "Clock", "VirtualClockLoop", "Events", "SimBackend",
                          "ModelBackend"})

# a control unit halted is so for good (its job is over here): it answers nothing and
# starts nothing, so what it still holds (its runner, a board dead since) decides nothing
HALTS = frozenset({"ControlUnit", "RtlControlUnit"})


def _registers() -> frozenset[int]:
    """A board's registers that are counts (transfers, bytes) or labels: the flow id, and
    the header words a transfer carries (the flow id's high word, its iteration and its
    submit time: written down with the delivered flow, read by no decision)."""
    out: set[int] = set()
    for p in ("H", "V"):
        for name in (f"TX{p}_DONE_COUNT", f"TX{p}_SENT_LO", f"TX{p}_SENT_HI",
                     f"RX{p}_BYTES_LO", f"RX{p}_BYTES_HI", f"RX{p}_DONE_COUNT",
                     f"TX{p}_FLOW", f"RX{p}_LAST_FLOW",
                     *(f"{d}{p}_HDR{w}" for d in ("TX", "RX") for w in (0, 3, 4, 5))):
            reg = R.BY_NAME.get(name)
            if reg is not None:
                out.add(reg.offset)
    return frozenset(out)


REGISTERS = _registers()


class Unkeyable(TypeError):
    """The walk met something it cannot key: the job is not extended."""


class _Walk:
    """One key: a flat list of tokens, in a deterministic walk of the roots."""

    def __init__(self, now: int, traced: bool = False) -> None:
        self.now = now
        self.out: list[Any] = []
        # (explaining a difference) the field each token was found in
        self.where: list[str] | None = [] if traced else None
        self.field = ""
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []  # every object walked stays alive (its id is not reused)

    def time(self, x: Any, v: Any, kind: str) -> None:
        """An absolute time, as `TIMES` says (-1: never, as the models say it)."""
        if not isinstance(v, int) or v < 0:
            self.out.append(v)
        elif kind == MARK or (kind == DEADLINE and v >= self.now):
            self.out.append(("t", v - self.now))
        elif kind == DEADLINE:
            self.out.append("passed")
        else:
            self.out.append(("d", getattr(x, kind) - v))

    def regs(self, regs: dict[int, int]) -> None:
        self.out.append(("regs", *(kv for kv in regs.items() if kv[0] not in REGISTERS)))

    def __call__(self, x: Any) -> None:
        out = self.out
        if self.where is not None:
            self.where.extend([self.field] * (len(out) - len(self.where)))
        if x is None or isinstance(x, (bool, int, float, str, bytes)):
            out.append(x)
            return
        if isinstance(x, enum.Enum):
            out.append(("e", x.value))
            return
        ref = self.seen.get(id(x))
        if ref is not None:
            out.append(("r", ref))
            return
        self.seen[id(x)] = len(self.seen)
        self.keep.append(x)
        cls = type(x).__name__
        if isinstance(x, (list, tuple, collections.deque)):
            out.append(("[", len(x)))
            for v in x:
                self(v)
        elif isinstance(x, dict):
            out.append(("{", len(x)))
            for k, v in x.items():
                self(k)
                self(v)
        elif isinstance(x, (set, frozenset)):  # in an order of their own: of values only
            if not all(_plain(v) for v in x):
                raise Unkeyable(f"cannot key a set of objects ({cls})")
            out.append(("s", tuple(sorted(map(repr, x)))))
        elif isinstance(x, (bytearray, memoryview, array.array)):
            out.append(("b", bytes(x)))
        elif isinstance(x, random.Random):
            out.append(("rng", x.getstate()))
        elif isinstance(x, types.MethodType):
            out.append(("m", x.__func__.__qualname__))
            self(x.__self__)
        elif isinstance(x, functools.partial):
            out.append(("p",))
            self(x.func)
            self(x.args)
            self(x.keywords)
        elif isinstance(x, (types.FunctionType, types.BuiltinFunctionType, type,
                            types.ModuleType)):
            # a callback is wiring, set up when the job starts: its name (what a closure
            # holds is walked where it lives, or is an observer's or the run's)
            out.append(("f", getattr(x, "__qualname__", repr(x))))
        elif cls in SKIP_CLASSES:
            out.append(("skip", cls))
        elif cls in HALTS and x.halted:
            out.append(("halted", cls))
        elif type(x).__module__ == "numpy":
            out.append(("np", str(getattr(x, "dtype", "")), getattr(x, "shape", ()),
                        x.tobytes() if hasattr(x, "tobytes") else repr(x)))
        else:
            kind: type = type(x)
            names = _fields(kind)
            if hasattr(x, "__dict__"):
                names = names + tuple(k for k in vars(x) if k not in names)
            elif not names:  # a C object with no visible state
                raise Unkeyable(f"cannot key a {type(x).__module__}.{cls}")
            out.append(("o", cls))
            left_out, times = _kinds(kind)
            for f in names:
                if f in left_out:
                    continue
                v = getattr(x, f, _MISSING)
                if v is _MISSING:  # a slot never set
                    out.append("unset")
                    continue
                if self.where is not None:
                    self.where.extend([self.field] * (len(out) - len(self.where)))
                    self.field = f"{cls}.{f}"
                if f == "regs" and cls == "ONicBoard":
                    self.regs(v)
                elif f in times:
                    self.time(x, v, times[f])
                else:
                    self(v)


_MISSING = object()


def _plain(v: Any) -> bool:
    """A value that is its own state (a set of them keys as its sorted reprs)."""
    if isinstance(v, tuple):
        return all(map(_plain, v))
    return v is None or isinstance(v, (bool, int, float, str, bytes, enum.Enum))


@functools.cache
def _fields(cls: type) -> tuple[str, ...]:
    """A class's declared fields in a fixed order (its slots, msgspec or dataclass fields);
    an instance dict's come after, in its own (insertion) order."""
    names: list[str] = []
    for c in reversed(cls.__mro__):
        for s in getattr(c, "__slots__", ()):
            if s not in ("__dict__", "__weakref__") and s not in names:
                names.append(s)
        if c.__module__.startswith("oddl.") and not hasattr(c, "__slots__"):
            # a class of the typed core, compiled (its .pxd): its fields are C's, seen
            # as descriptors, in the order the .pxd declares them (a property looks the
            # same: it is keyed too, where it can only keep a repeat from being found)
            names += [k for k, v in vars(c).items() if isinstance(v, types.GetSetDescriptorType)
                      and k not in ("__dict__", "__weakref__") and k not in names]
    names += [f for f in getattr(cls, "__struct_fields__", ()) if f not in names]
    if dataclasses.is_dataclass(cls):
        names += [f.name for f in dataclasses.fields(cls) if f.name not in names]
    return tuple(names)


@functools.cache
def _kinds(cls: type) -> tuple[frozenset[str], dict[str, str]]:
    """A class's fields left out of the key, and its time fields (its bases' too)."""
    names = [c.__name__ for c in cls.__mro__]
    return (frozenset(f for (c, f) in NOT_STATE if c in names),
            {f: k for (c, f), k in TIMES.items() if c in names})


def key(roots: Iterable[Any], events: list[tuple[int, Any, tuple[Any, ...]]], now: int,
        observers: frozenset[Any], traced: bool = False) -> list[Any]:
    """The key at `now`: the pending events (time, callback, arguments; in the loop's
    order, observers' left out) and the roots' state (`traced`: each token followed by
    the field it came from)."""
    w = _Walk(now, traced)
    for t, cb, args in events:
        if cb in observers or getattr(cb, "__func__", None) in observers or \
                type(getattr(cb, "__self__", None)).__name__ in SKIP_CLASSES:
            continue
        w.out.append(("ev", t - now))
        w(cb)
        w(args)
    for r in roots:
        w(r)
    if w.where is not None:
        w.where.extend([w.field] * (len(w.out) - len(w.where)))
        return list(zip(w.out, w.where, strict=True))
    return w.out


def explain(a: list[Any], b: list[Any]) -> str:
    """Where two traced keys (`key(..., traced=True)`) first differ."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"token {i} of {x[1] or 'the events'}: {x[0]!r} != {y[0]!r}"
    return "equal" if len(a) == len(b) else f"lengths {len(a)} != {len(b)}"


@dataclasses.dataclass
class Extension:
    """What a job's extension added: iterations written rather than simulated, and the
    counts they add, per iteration."""

    simulated: int
    copies: int
    period_ns: int
    delta: dict[str, int]

    def outcome(self, out: JobOutcome) -> JobOutcome:
        """The job's outcome as the full run's: its counts, each `copies` times more."""
        n, d = self.copies, self.delta
        stats = {k: v + n * d.get(k, 0) if _count(v) else v for k, v in out.stats.items()}
        return JobOutcome(out.control_messages + n * d["control_messages"],
                          out.flows + n * d["flows"], stats, out.violations, out.trace,
                          {"simulated": self.simulated, "copies": n,
                           "period_ns": self.period_ns})


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def counts(out: JobOutcome) -> dict[str, Any]:
    """An outcome's figures, flat: messages, flows and every statistic."""
    return {"control_messages": out.control_messages, "flows": out.flows, **out.stats}


def per_iteration(a: dict[str, Any], b: dict[str, Any]) -> dict[str, int] | None:
    """What one iteration added to each count (None: a figure that is not a count
    changed, so the copies could not say it)."""
    if a.keys() != b.keys():
        return None
    d: dict[str, int] = {}
    for k, x in a.items():
        y = b[k]
        if _count(x) and _count(y):
            d[k] = y - x
        elif x != y:
            return None
    return d


class Steady:
    """A job's search for its repeated iteration (`run_in_process` drives it): probes in
    pairs, the counts at the boundaries after them, and the extension once found."""

    def __init__(self, loop: VirtualClockLoop, roots: Callable[[], list[Any]],
                 outcome: Callable[[], JobOutcome], start: int,
                 observers: Iterable[Any] = (), allowed: Callable[[], bool] = lambda: True
                 ) -> None:
        self.loop, self.roots, self.outcome_now = loop, roots, outcome
        self.start = start
        self.observers = frozenset(observers)
        self.allowed = allowed  # the back end: nothing of its own still to come
        self.last: tuple[int, list[Any]] | None = None  # the latest probe and its key
        # the latest probed iteration, as recorded, and the counts at its end
        self.before: tuple[Iteration, dict[str, Any]] | None = None
        self.found: int | None = None  # the first iteration of the repeats
        self.gave_up = ""  # why the search stopped (the run goes on in full)
        self.extension: Extension | None = None

    def probing(self, i: int) -> bool:
        """Iteration i is probed: the job's 2nd and 3rd, 4th and 5th, 8th and 9th, ..."""
        n = i - self.start
        return not self.gave_up and self.found is None and n >= 2 and \
            ((n & (n - 1)) == 0 or ((n - 1) & (n - 2)) == 0)

    def probe(self, i: int) -> None:
        """At iteration i's compute end: its key; equal to iteration i - 1's, the repeats
        begin with iteration i."""
        try:
            k = key(self.roots(), self.loop.pending(), self.loop.now_ns(), self.observers)
        except Unkeyable as e:
            self.gave_up = str(e)
            return
        if self.last is not None and self.last[0] == i - 1 and self.last[1] == k:
            self.found = i
        self.last = (i, k)

    def boundary(self, it: Iteration) -> None:
        """Iteration `it` has ended: its counts and itself, if it was probed (the one
        before the repeats is)."""
        if self.last is not None and self.last[0] == it.iteration and self.found is None:
            self.before = (it, counts(self.outcome_now()))

    def extend(self, last: Iteration, total: int) -> Iterator[Iteration] | None:
        """After iteration `found` (the first repeat) ended: every later one, as copies of
        it (None: a figure the copies could not say, or the back end has something still
        to come). A copy's flows are the last one's, later by the period, their ids on by
        as many as from the iteration before (rank r's k-th flow is k * n + r)."""
        i = last.iteration
        if self.found != i or i + 1 >= total or self.before is None \
                or self.before[0].iteration != i - 1:
            return None
        if not self.allowed():  # found again later, once nothing is to come
            self.found = self.last = None
            return None
        prev, before = self.before
        delta = per_iteration(before, counts(self.outcome_now()))
        period = last.t_end - prev.t_end  # (a pause before an iteration included)
        steps = _id_steps(prev.flows, last.flows, period)
        if delta is None or steps is None:
            self.gave_up = "a figure that is not a count changed from one iteration to the next"
            return None
        self.extension = Extension(i + 1 - self.start, total - 1 - i, period, delta)
        rep = Repeats(i, period, last.flows, steps)
        return (Iteration(j, last.t_start + (j - i) * period, last.t_end + (j - i) * period,
                          last.control_messages, repeats=rep)
                for j in range(i + 1, total))


def _id_steps(a: list[FlowRow], b: list[FlowRow], period: int) -> list[int] | None:
    """How far each flow's id moves from one iteration to the next (None: the two
    iterations' flows are not the same flows a period apart)."""
    if len(a) != len(b):
        return None
    steps = []
    for x, y in zip(a, b, strict=True):
        if x[1:6] != y[1:6] or y[6] - x[6] != period or y[7] - x[7] != period:
            return None
        steps.append(y[0] - x[0])
    return steps
