"""TopoOpt (seeds/003) as a flow-level baseline: a static direct-connect topology.

Each node has `degree` ports of `link_gbps`; port k of node i is a fixed fibre to node
i + jump_k (mod N), the jumps chosen by TotientPerms as TopoOpt's released code chooses
them (controller/base/jumps.py), so the topology is a union of ring permutations with diameter
O(d N^(1/d)); `jumps` says which, `topology` its diameter and mean hop count. Nothing is
reconfigured during training. A flow takes a fewest-hops path over the jumps (TopoOpt's
coin change) and is forwarded by the hosts on the way: every hop holds link capacity and
adds `latency_ns` (NIC + host forwarding). Rates are max-min fair on every link.
"""

from __future__ import annotations

from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.jumps import JumpSet, jump_routes, totient_jumps
from oddl.controller.base.messages import Flow
from oddl.sim.electrical import FlowNetwork


class TopoOpt(FlowNetwork):
    name = "topoopt"

    def __init__(self, clock: Clock, nodes: list[str], line_rate_gbps: float,
                 latency_ns: float, deliver: Callable[[Flow], None], degree: int = 4,
                 link_gbps: float | None = None, bidirectional: bool = False) -> None:
        self.n = len(nodes)
        self.nodes = nodes
        self.pos = {n: i for i, n in enumerate(nodes)}
        self.jumps = totient_jumps(self.n, degree, bidirectional=bidirectional)
        self.routes = jump_routes(self.n, self.jumps) if self.n > 1 else [()]
        self.topology = JumpSet.of(self.n, self.jumps, self.routes)
        self.link_gbps = link_gbps or line_rate_gbps
        cap: dict[object, float] = {(i, j): self.link_gbps for i in range(self.n)
                                    for j in self.jumps}
        self.hop_latency_ns = round(latency_ns)
        super().__init__(clock, cap, self._path, latency_ns, deliver)

    def _path(self, f: Flow) -> tuple[object, ...]:
        at = self.pos[f.src]
        links = []
        for j in self.routes[(self.pos[f.dst] - at) % self.n]:
            links.append((at, j))
            at = (at + j) % self.n
        return tuple(links)

    def describe(self) -> dict[str, int | float]:
        return {"diameter": self.topology.diameter,
                "mean_hops": round(self.topology.mean_hops, 3)}

    def hops(self, src: str, dst: str) -> int:
        return len(self.routes[(self.pos[dst] - self.pos[src]) % self.n])

    def _latency(self, flow: Flow) -> int:
        return self.hops(flow.src, flow.dst) * self.hop_latency_ns
