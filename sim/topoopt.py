"""TopoOpt (seeds/003) as a flow-level baseline: a static direct-connect topology.

Each node has `degree` ports of `link_gbps`; port k of node i is a fixed fibre to node
i + jump_k (mod N), the jumps chosen by TotientPerms (controller/planner.py): coprime
with N, spread geometrically, so the topology is a union of ring permutations with
diameter O(d N^(1/d)). Nothing is reconfigured during training. A flow takes a shortest
path over the jumps (BFS on the circulant graph, ties broken by the order of jumps) and is
forwarded by the hosts on the way: every hop holds link capacity and adds `latency_ns`
(NIC + host forwarding). Rates are max-min fair on every link.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from oddl.controller.clock import Clock
from oddl.controller.jumps import totient_jumps
from oddl.controller.messages import Flow
from oddl.sim.electrical import FlowNetwork


def jump_routes(n: int, jumps: list[int]) -> list[tuple[int, ...]]:
    """For every offset 0..n-1, a shortest sequence of jumps reaching it from 0."""
    route: list[tuple[int, ...] | None] = [None] * n
    route[0] = ()
    q = deque([0])
    while q:
        u = q.popleft()
        for j in jumps:
            v = (u + j) % n
            if route[v] is None:
                route[v] = (*route[u], j)  # type: ignore[misc]
                q.append(v)
    missing = [v for v in range(n) if route[v] is None]
    if missing:
        raise ValueError(f"jumps {jumps} do not connect {n} nodes (offset {missing[0]})")
    return route  # type: ignore[return-value]


class TopoOpt(FlowNetwork):
    name = "topoopt"

    def __init__(self, clock: Clock, nodes: list[str], line_rate_gbps: float,
                 latency_ns: float, deliver: Callable[[Flow], None], degree: int = 4,
                 link_gbps: float | None = None) -> None:
        self.n = len(nodes)
        self.nodes = nodes
        self.pos = {n: i for i, n in enumerate(nodes)}
        self.jumps = totient_jumps(self.n, degree) if self.n > 1 else []
        self.routes = jump_routes(self.n, self.jumps) if self.n > 1 else [()]
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

    def hops(self, src: str, dst: str) -> int:
        return len(self.routes[(self.pos[dst] - self.pos[src]) % self.n])

    def _latency(self, flow: Flow) -> int:
        return self.hops(flow.src, flow.dst) * self.hop_latency_ns
