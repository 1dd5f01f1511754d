"""SiP-Ring (SiP-ML, seeds/000-001) as a flow-level baseline.

Nodes sit on a fibre ring in placement order, one fibre per direction. Each node has
`degree` silicon-photonic transceivers of `lambda_gbps` each (its degree budget: at most
that many simultaneous lightpaths); each fibre carries `wavelengths` channels, reused on
every segment a lightpath does not cross. A flow from a to b takes the shorter way round
and holds capacity on every segment it crosses. Flow-level and fluid: a pair's share of
a segment is max-min fair, not rounded to whole wavelengths (that rounding can only make
SiP-Ring slower; the choice is written in docs/baselines.md).

Reconfiguration: when a node's partner changes, its micro-ring filters retune before the
new flow may start (`reconfig_ns`, SiP-ML's microsecond-scale MRR switching). Placement
is SiP-ML's degree-aware one for a data-parallel all-reduce: ring order = rank order, so
ring all-reduce neighbours are adjacent (one segment) and a halving-doubling partner at
rank distance 2^k is 2^k segments away.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.electrical import FlowNetwork


class SipRing(FlowNetwork):
    name = "sipring"

    def __init__(self, clock: Clock, nodes: list[str], line_rate_gbps: float,
                 latency_ns: float, deliver: Callable[[Flow], None], wavelengths: int = 64,
                 degree: int = 4, reconfig_ns: float = 25_000.0,
                 lambda_gbps: float | None = None) -> None:
        if wavelengths < 1 or degree < 1 or reconfig_ns < 0:
            raise ValueError("SiP-Ring needs wavelengths >= 1, degree >= 1, reconfig_ns >= 0")
        self.n = len(nodes)
        self.pos = {n: i for i, n in enumerate(nodes)}
        # the node's optical I/O equals the line rate unless the wavelength rate is given
        self.lambda_gbps = lambda_gbps or line_rate_gbps / degree
        self.degree = degree
        self.reconfig_ns = math.ceil(reconfig_ns)
        self.partner: dict[str, str] = {}
        self._paths: dict[tuple[str, str], tuple[object, ...]] = {}
        self.reconfigs = 0
        node_gbps = degree * self.lambda_gbps
        seg_gbps = wavelengths * self.lambda_gbps
        cap: dict[object, float] = {}
        for n in nodes:
            cap[("tx", n)] = node_gbps
            cap[("rx", n)] = node_gbps
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
        a, b = self.pos[src], self.pos[dst]
        n = self.n
        fwd = (b - a) % n
        if fwd <= n - fwd:
            segs = [("cw", (a + k) % n) for k in range(fwd)]
        else:
            segs = [("ccw", (a - k - 1) % n) for k in range(n - fwd)]
        return (("tx", src), *segs, ("rx", dst))

    def hops(self, src: str, dst: str) -> int:
        d = (self.pos[dst] - self.pos[src]) % self.n
        return min(d, self.n - d)

    def submit(self, flow: Flow) -> None:
        if self.partner.get(flow.src) == flow.dst:
            super().submit(flow)
            return
        self.partner[flow.src] = flow.dst  # retune the micro-rings, then send
        self.reconfigs += 1
        self.clock.call_later_ns(self.reconfig_ns, FlowNetwork.submit, self, flow)
