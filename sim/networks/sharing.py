"""How a link's capacity is split among the jobs that share it (docs/cassini.md).

The flow solver (sim/networks/electrical.py) is weighted max-min: a flow's rate is its weight times
the water level. These policies give the weights:

- `Fair`: every connection 1 (max-min fair, what TCP-like congestion control converges
  to; a job's flows from one rank to one peer are one connection: `per_connection`);
- `Weighted`: a fixed weight per job (unfair sharing: 0.6 and 0.4 give one job 60 % of a
  link both saturate);
- `MLTCP`: a job's weight grows as it gets through its iteration's bytes,
  F = slope x bytes_ratio + intercept, bytes_ratio = bytes the job has sent in this
  iteration / bytes it sends per iteration. The job nearer the end of its communication
  gets more, finishes first and starts computing; the other finishes later. Iteration by
  iteration the jobs drift apart until their communication interleaves. A job learns its
  bytes per iteration from its first iteration (ratio 0, weight = intercept, until then).
  The weight is the job's, over all its flows (MLTCP counts per connection; a job's
  connections advance together in a collective). The fluid model re-solves every
  `tick_ns` while flows are active, as a sender's window follows the ratio as it goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from oddl.controller.base.messages import Flow
from oddl.controller.stage2.invariants import tag_of


class Sharing:
    """Max-min fair: no weights."""

    name = "fair"
    tick_ns = 0  # re-solve this often while flows are active (0: on flow events only)
    # the rates are a congestion-control law's (sim/networks/congestion.py), not max-min shares
    controls_rates = False

    def join(self, tag: int, weight: float) -> None:
        """Job `tag` starts on the network with this weight (used by `Weighted`)."""

    def submitted(self, flow: Flow) -> None: ...

    def finished(self, flow: Flow) -> None: ...

    def attach(self, net: Any) -> None:
        """The network whose links it shares (a law needs their capacities and queues)."""

    def added(self, a: Any) -> None:
        """A flow (the solver's `_Active`) is on the network."""

    def removed(self, a: Any) -> None:
        """A flow has left the network."""

    def step(self, now: int) -> bool:
        """Every `tick_ns` while flows are active, before the rates are solved again;
        False: nothing changes until a flow comes or goes (stop ticking till then)."""
        return True

    def rates(self, comp: list[Any]) -> list[float]:
        raise NotImplementedError("only a congestion-control law sets the rates")

    def describe(self) -> dict[str, float]:
        """Counters a run reports (a law's CNPs, losses, queues; none for the fluid)."""
        return {}

    def weights(self, comp: list[Any], active: Iterable[Any], now: int,
                conns: Mapping[Any, int] | None = None) -> list[float] | None:
        """Each flow of `comp`'s weight (None: all 1); `conns`: the flows on each
        connection, when the network already counts them (comp is every active flow)."""
        return per_connection(comp, None, conns)


Fair = Sharing


def per_connection(comp: list[Any], w: list[float] | None,
                   conns: Mapping[Any, int] | None = None) -> list[float] | None:
    """A job's flows from one rank to one peer are one connection (a collective keeps one
    per peer, and ECMP hashes it so): a rank whose next step's data queues behind this
    step's on the same connection does not get a second share of the link. Each flow gets
    its weight divided by the flows on its connection; None: every weight 1. `conns`:
    those counts, when the caller keeps them (comp is every active flow)."""
    if conns is None:
        counted: dict[tuple[int, str, str], int] = {}
        for a in comp:
            counted[a.conn] = counted.get(a.conn, 0) + 1
        conns = counted
    if w is None and len(conns) == len(comp):
        return None
    return [(1.0 if w is None else w[i]) / conns[a.conn] for i, a in enumerate(comp)]


class Weighted(Sharing):
    name = "weighted"

    def __init__(self) -> None:
        self.by_tag: dict[int, float] = {}

    def join(self, tag: int, weight: float) -> None:
        self.by_tag[tag] = weight

    def weights(self, comp: list[Any], active: Iterable[Any], now: int,
                conns: Mapping[Any, int] | None = None) -> list[float] | None:
        return per_connection(comp, [self.by_tag.get(tag_of(a.flow.id), 1.0) for a in comp],
                              conns)


class MLTCP(Sharing):
    name = "mltcp"

    def __init__(self, slope: float, intercept: float, tick_ns: int) -> None:
        if slope < 0 or intercept <= 0 or tick_ns < 1:
            raise ValueError("MLTCP needs slope >= 0, intercept > 0 and a tick >= 1 ns")
        self.slope, self.intercept, self.tick_ns = slope, intercept, tick_ns
        self.iteration: dict[int, int] = {}  # tag -> the iteration its flows belong to
        self.done: dict[int, float] = {}  # tag -> bits of that iteration delivered
        self.per_iteration: dict[int, float] = {}  # tag -> bits it sends per iteration

    def submitted(self, flow: Flow) -> None:
        tag = tag_of(flow.id)
        if self.iteration.get(tag, -1) < flow.iteration:
            if tag in self.iteration:  # the last iteration is over: its bytes are learnt
                self.per_iteration[tag] = self.done[tag]
            self.iteration[tag], self.done[tag] = flow.iteration, 0.0

    def finished(self, flow: Flow) -> None:
        tag = tag_of(flow.id)
        if flow.iteration == self.iteration.get(tag):
            self.done[tag] += flow.nbytes * 8

    def ratio(self, tag: int, inflight: float) -> float:
        total = self.per_iteration.get(tag)
        return min(1.0, (self.done.get(tag, 0.0) + inflight) / total) if total else 0.0

    def weights(self, comp: list[Any], active: Iterable[Any], now: int,
                conns: Mapping[Any, int] | None = None) -> list[float] | None:
        inflight: dict[int, float] = {}
        for a in active:
            tag = tag_of(a.flow.id)
            if a.flow.iteration == self.iteration.get(tag):
                sent = a.flow.nbytes * 8 - a.remaining + a.rate * (now - a.last)
                inflight[tag] = inflight.get(tag, 0.0) + sent
        f = {t: self.slope * self.ratio(t, b) + self.intercept for t, b in inflight.items()}
        return per_connection(comp, [f.get(tag_of(a.flow.id), self.intercept) for a in comp],
                              conns)


def sharing_of(kind: str, slope: float = 1.0, intercept: float = 1.0,
               tick_ns: int = 100_000) -> Sharing:
    """A fluid policy by name (the laws: sim/networks/congestion.py)."""
    if kind == "fair":
        return Fair()
    if kind == "weighted":
        return Weighted()
    if kind == "mltcp":
        return MLTCP(slope, intercept, tick_ns)
    raise ValueError(f"unknown fluid sharing {kind!r} (fair, weighted or mltcp)")
