"""The ideal one-tier electrical switch: non-blocking, one full-duplex link per node.

Flow-level fluid model: each active flow crosses its source's uplink and its destination's
downlink; rates are max-min fair over those links (progressive filling), recomputed only
on the connected component of flows a change touches, so permutation traffic costs O(1)
per flow. A flow's last bit reaches the destination `latency_ns` after it leaves.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from controller.clock import Clock
from controller.messages import Flow


class _Active:
    __slots__ = ("flow", "handle", "last", "links", "rate", "remaining")

    def __init__(self, flow: Flow, now: int, links: tuple[tuple[str, str], tuple[str, str]]):
        self.flow = flow
        self.remaining = float(flow.nbytes * 8)  # bits
        self.rate = 0.0  # bits per ns
        self.last = now
        self.links = links
        self.handle = None


def max_min_rates(flow_links: list[tuple[object, ...]], capacity: dict[object, float]
                  ) -> list[float]:
    """Progressive filling: raise all unfrozen rates together until a link saturates."""
    n = len(flow_links)
    rate = [0.0] * n
    frozen = [False] * n
    cap = dict(capacity)
    users: dict[object, list[int]] = {}
    for i, ls in enumerate(flow_links):
        for link in ls:
            users.setdefault(link, []).append(i)
    active_links = {link for link in users}
    while True:
        best, share = None, math.inf
        for link in active_links:
            k = sum(1 for i in users[link] if not frozen[i])
            if k and cap[link] / k < share:
                best, share = link, cap[link] / k
        if best is None:
            return rate
        for i in users[best]:
            if frozen[i]:
                continue
            frozen[i] = True
            rate[i] = share
            for link in flow_links[i]:
                cap[link] -= share
        active_links.discard(best)


def max_min_rates_np(flow_links: list[tuple[object, ...]], capacity: dict[object, float]
                     ) -> list[float]:
    """Progressive filling, vectorised (numpy): the same answer as `max_min_rates`."""
    import numpy as np

    links = list(capacity)
    idx = {k: i for i, k in enumerate(links)}
    nf, nl = len(flow_links), len(links)
    rows = np.repeat(np.arange(nf), [len(ls) for ls in flow_links])
    cols = np.fromiter((idx[k] for ls in flow_links for k in ls), dtype=np.int64,
                       count=len(rows))
    cap = np.array([capacity[k] for k in links], dtype=float)
    rate = np.zeros(nf)
    active = np.ones(nf, dtype=bool)
    live_link = np.ones(nl, dtype=bool)
    while active.any():
        users = np.bincount(cols[active[rows]], minlength=nl).astype(float)
        ok = live_link & (users > 0)
        if not ok.any():
            break
        share = np.full(nl, np.inf)
        share[ok] = cap[ok] / users[ok]
        b = int(np.argmin(share))
        s = share[b]
        frozen = np.zeros(nf, dtype=bool)
        frozen[rows[(cols == b) & active[rows]]] = True
        rate[frozen] = s
        np.subtract.at(cap, cols[frozen[rows]], s)
        active &= ~frozen
        live_link[b] = False
    return rate.tolist()


class FlowNetwork:
    """Flows on fixed link paths, rates max-min fair, recomputed per connected component."""

    name = "flow-network"
    VECTORISE_ABOVE = 64  # flows in a component; below it the plain solver is faster

    def __init__(self, clock: Clock, capacity: dict[object, float],
                 path: Callable[[Flow], tuple[object, ...]], latency_ns: float,
                 deliver: Callable[[Flow], None]) -> None:
        self.clock = clock
        self.capacity = capacity  # bits per ns (Gb/s)
        self.path = path
        self.latency_ns = math.ceil(latency_ns)
        self.deliver = deliver
        self.users: dict[object, list[_Active]] = {k: [] for k in capacity}
        self.flows = 0
        self.control_messages = 0

    def submit(self, flow: Flow) -> None:
        now = self.clock.now_ns()
        a = _Active(flow, now, self.path(flow))  # type: ignore[arg-type]
        for link in a.links:
            self.users[link].append(a)
        self.flows += 1
        self._rebalance(a, now)

    def _latency(self, flow: Flow) -> int:
        return self.latency_ns

    def _rates(self, comp: list[_Active]) -> list[float]:
        if len(comp) == 1:
            return [min(self.capacity[k] for k in comp[0].links)]
        caps = {link: self.capacity[link] for a in comp for link in a.links}
        solver = max_min_rates_np if len(comp) > self.VECTORISE_ABOVE else max_min_rates
        return solver([a.links for a in comp], caps)

    def _component(self, seed: _Active) -> list[_Active]:
        seen = {id(seed): seed}
        stack = [seed]
        while stack:
            a = stack.pop()
            for link in a.links:
                for b in self.users[link]:
                    if id(b) not in seen:
                        seen[id(b)] = b
                        stack.append(b)
        return list(seen.values())

    def _rebalance(self, seed: _Active, now: int) -> None:
        comp = self._component(seed)
        for a in comp:
            a.remaining -= a.rate * (now - a.last)
            a.last = now
        rates = self._rates(comp)
        for a, r in zip(comp, rates, strict=True):
            if a.handle is not None and r == a.rate:
                continue
            a.rate = r
            if a.handle is not None:
                a.handle.cancel()
            t_end = now + max(0, math.ceil(a.remaining / r - 1e-6))
            a.handle = self.clock.call_at_ns(t_end, self._finish, a)

    def _finish(self, a: _Active) -> None:
        now = self.clock.now_ns()
        neighbours: list[_Active] = []
        for link in a.links:
            lst = self.users[link]
            lst.remove(a)
            neighbours.extend(lst)
        self.clock.call_at_ns(now + self._latency(a.flow), self.deliver, a.flow)
        done: set[int] = set()
        for b in neighbours:
            if id(b) not in done:
                done.update(id(c) for c in self._component(b))
                self._rebalance(b, now)


class ElectricalSwitch(FlowNetwork):
    """The ideal one-tier switch: a flow crosses only its source's up and destination's
    down link, each at the line rate."""

    name = "electrical"

    def __init__(self, clock: Clock, nodes: list[str], rate_gbps: float, latency_ns: float,
                 deliver: Callable[[Flow], None]) -> None:
        cap: dict[object, float] = {}
        for n in nodes:
            cap[("up", n)] = rate_gbps
            cap[("down", n)] = rate_gbps
        super().__init__(clock, cap, lambda f: (("up", f.src), ("down", f.dst)), latency_ns,
                         deliver)
