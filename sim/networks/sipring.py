"""SiP-ML (seeds/000-001) as flow-level baselines: SiP-Ring and SiP-OCS.

Each node (GPU) has `degree` silicon-photonic transceivers of `lambda_gbps` each. A flow
from a to b needs a lightpath a -> b: one of a's transmitters and one of b's receivers
tuned to each other. That is the degree limit: at most `degree` lightpaths leave a node
and `degree` arrive at it at once. A lightpath stays tuned after its flows end (traffic
to the same peer needs no retuning); a flow to a new peer takes an idle lightpath's
transceivers (the least recently used) and waits `reconfig_ns` while the micro-rings
retune; with every lightpath of a or b busy, it waits until one is idle. A node's
transceivers pool their bandwidth (degree x lambda_gbps) among its flows.

- SiP-Ring: the nodes sit on a fibre ring, one fibre per direction; each fibre carries
  `wavelengths` channels, reused on every segment a lightpath does not cross. A lightpath
  takes the shorter way round and holds capacity on every segment it crosses.
- SiP-OCS: the transceivers meet in an optical circuit switch; a lightpath is a circuit,
  any pair, no segment to share.

Flow-level and fluid: a pair's share of a segment is max-min fair, not rounded to whole
wavelengths (that rounding can only make SiP-Ring slower; docs/baselines.md).

Placement is SiP-ML's: the ring order (which GPU sits where) follows the job's traffic,
not its rank order (`ring_order`): each next position goes to the unplaced rank that
exchanges the most bytes with the one just placed, so the heavy pairs (a ring's
neighbours, a tensor group, halving-doubling's first partners) are one segment apart.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.networks.electrical import FlowNetwork, _Active


def ring_order(nodes: Sequence[str], traffic: Mapping[tuple[str, str], int]) -> list[str]:
    """SiP-ML's placement on the ring: greedy from the first node, each next position the
    unplaced node with the most bytes to or from the last placed (ties: the most with any
    placed node, then the earlier node); nodes with no traffic keep their order, last."""
    both: dict[str, dict[str, int]] = {n: {} for n in nodes}
    for (a, b), nbytes in traffic.items():
        if a != b and a in both and b in both:
            both[a][b] = both[a].get(b, 0) + nbytes
            both[b][a] = both[b].get(a, 0) + nbytes
    index = {n: i for i, n in enumerate(nodes)}
    talking = [n for n in nodes if both[n]]
    if not talking:
        return list(nodes)
    order = [talking[0]]
    placed = {talking[0]}
    near = dict(both[talking[0]])  # bytes with any placed node
    while len(order) < len(talking):
        last = both[order[-1]]
        pick = min((n for n in near if n not in placed),
                   key=lambda n: (-last.get(n, 0), -near[n], index[n]), default=None)
        if pick is None:  # another connected group: start it at its first node
            pick = next(n for n in talking if n not in placed)
        order.append(pick)
        placed.add(pick)
        for m, nbytes in both[pick].items():
            near[m] = near.get(m, 0) + nbytes
    return order + [n for n in nodes if not both[n]]


class SipRing(FlowNetwork):
    name = "sipring"

    def __init__(self, clock: Clock, nodes: list[str], line_rate_gbps: float,
                 latency_ns: float, deliver: Callable[[Flow], None], wavelengths: int = 64,
                 degree: int = 4, reconfig_ns: float = 25_000.0,
                 lambda_gbps: float | None = None, order: Sequence[str] | None = None,
                 ocs: bool = False) -> None:
        if wavelengths < 1 or degree < 1 or reconfig_ns < 0:
            raise ValueError("SiP-ML needs wavelengths >= 1, degree >= 1, reconfig_ns >= 0")
        order = list(order) if order is not None else list(nodes)
        if sorted(order) != sorted(nodes):
            raise ValueError("the ring order must place every node once")
        self.name = "sipocs" if ocs else "sipring"
        self.ocs = ocs
        self.n = len(order)
        self.order = order
        self.pos = {n: i for i, n in enumerate(order)}
        # the node's optical I/O equals the line rate unless the wavelength rate is given
        self.lambda_gbps = lambda_gbps or line_rate_gbps / degree
        self.degree = degree
        self.reconfig_ns = math.ceil(reconfig_ns)
        # each node's lightpaths out and in: peer -> flows on it (tuned, maybe idle),
        # least recently used first
        self.tx: dict[str, OrderedDict[str, int]] = {n: OrderedDict() for n in nodes}
        self.rx: dict[str, OrderedDict[str, int]] = {n: OrderedDict() for n in nodes}
        self.waiting: deque[Flow] = deque()  # flows no lightpath can take yet
        self._paths: dict[tuple[str, str], tuple[object, ...]] = {}
        self.reconfigs = 0
        self.blocked = 0  # flows that waited for a lightpath (the degree limit)
        self.max_lightpaths = 0  # the most any node held at once, either way
        node_gbps = degree * self.lambda_gbps
        seg_gbps = wavelengths * self.lambda_gbps
        cap: dict[object, float] = {}
        for n in nodes:
            cap[("tx", n)] = node_gbps
            cap[("rx", n)] = node_gbps
        if not ocs:
            for i in range(self.n):
                cap[("cw", i)] = seg_gbps  # segment i -> i+1
                cap[("ccw", i)] = seg_gbps  # segment i+1 -> i
        super().__init__(clock, cap, self._path, latency_ns, deliver)

    def _path(self, f: Flow) -> tuple[object, ...]:
        key = (f.src, f.dst)
        path = self._paths.get(key)
        if path is None:  # a ring all-reduce asks for the same n pairs 2(n - 1) times
            path = self._paths[key] = self._route(f.src, f.dst)
        return path

    def _route(self, src: str, dst: str) -> tuple[object, ...]:
        if self.ocs:
            return (("tx", src), ("rx", dst))
        a, b = self.pos[src], self.pos[dst]
        n = self.n
        fwd = (b - a) % n
        if fwd <= n - fwd:
            segs = [("cw", (a + k) % n) for k in range(fwd)]
        else:
            segs = [("ccw", (a - k - 1) % n) for k in range(n - fwd)]
        return (("tx", src), *segs, ("rx", dst))

    def hops(self, src: str, dst: str) -> int:
        if self.ocs:
            return 1
        d = (self.pos[dst] - self.pos[src]) % self.n
        return min(d, self.n - d)

    def describe(self) -> dict[str, int | float]:
        return {"reconfigs": self.reconfigs, "blocked_by_degree": self.blocked,
                "max_lightpaths": self.max_lightpaths}

    @staticmethod
    def _slot(paths: OrderedDict[str, int], peer: str, degree: int) -> bool:
        """Whether a lightpath to `peer` exists or can be tuned (an idle one retuned)."""
        return peer in paths or len(paths) < degree or any(k == 0 for k in paths.values())

    @staticmethod
    def _take(paths: OrderedDict[str, int], peer: str, degree: int) -> bool:
        """Put a flow on the lightpath to `peer`; True if it had to be tuned."""
        if peer in paths:
            paths[peer] += 1
            paths.move_to_end(peer)
            return False
        if len(paths) >= degree:
            del paths[next(k for k, v in paths.items() if v == 0)]  # the LRU idle one
        paths[peer] = 1
        return True

    def submit(self, flow: Flow) -> None:
        if not self._start(flow):
            self.waiting.append(flow)
            self.blocked += 1

    def _start(self, flow: Flow) -> bool:
        s, d = flow.src, flow.dst
        if not (self._slot(self.tx[s], d, self.degree) and
                self._slot(self.rx[d], s, self.degree)):
            return False
        tuned = self._take(self.tx[s], d, self.degree) | self._take(self.rx[d], s, self.degree)
        self.max_lightpaths = max(self.max_lightpaths, len(self.tx[s]), len(self.rx[d]))
        if tuned:  # retune the micro-rings at both ends, then send
            self.reconfigs += 1
            self.clock.call_later_ns(self.reconfig_ns, FlowNetwork.submit, self, flow)
        else:
            FlowNetwork.submit(self, flow)
        return True

    def _finish(self, a: _Active) -> None:
        f = a.flow
        self.tx[f.src][f.dst] -= 1
        self.rx[f.dst][f.src] -= 1
        super()._finish(a)
        if self.waiting:  # the waiting flows that can go now, in the order they came
            self.waiting = deque(w for w in self.waiting if not self._start(w))
