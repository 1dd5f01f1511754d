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


class ElectricalSwitch:
    name = "electrical"

    def __init__(self, clock: Clock, nodes: list[str], rate_gbps: float, latency_ns: float,
                 deliver: Callable[[Flow], None]) -> None:
        self.clock = clock
        self.rate = rate_gbps
        self.latency_ns = math.ceil(latency_ns)
        self.deliver = deliver
        self.users: dict[tuple[str, str], list[_Active]] = {}
        for n in nodes:
            self.users[("up", n)] = []
            self.users[("down", n)] = []
        self.flows = 0
        self.control_messages = 0

    def submit(self, flow: Flow) -> None:
        now = self.clock.now_ns()
        a = _Active(flow, now, (("up", flow.src), ("down", flow.dst)))
        for link in a.links:
            self.users[link].append(a)
        self.flows += 1
        self._rebalance(a, now)

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
        if len(comp) == 1:
            rates = [self.rate]
        else:
            caps = {link: self.rate for a in comp for link in a.links}
            rates = max_min_rates([a.links for a in comp], caps)
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
        self.clock.call_at_ns(now + self.latency_ns, self.deliver, a.flow)
        done: set[int] = set()
        for b in neighbours:
            if id(b) not in done:
                done.update(id(c) for c in self._component(b))
                self._rebalance(b, now)
