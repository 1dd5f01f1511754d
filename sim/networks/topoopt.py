"""TopoOpt (seeds/003) as a flow-level baseline: a static direct-connect topology.

Each node has `degree` ports of `link_gbps`; port k of node i is a fixed fibre to node
i + jump_k (mod N), the jumps chosen by TotientPerms as TopoOpt's released code chooses
them (controller/base/jumps.py), so the topology is a union of ring permutations with diameter
O(d N^(1/d)); `jumps` says which, `topology` its diameter and mean hop count. Nothing is
reconfigured during training. A flow takes a fewest-hops path over the jumps (TopoOpt's
coin change) and is forwarded by the hosts on the way: every hop holds link capacity and
adds `latency_ns` (NIC + host forwarding). Rates are max-min fair on every link.

A hybrid-parallel job gets TopoOpt's co-designed topology instead (`Topology`): a direct
fibre per model-parallel pair, and TotientPerms over each data-parallel group on the ports
left; a flow no fibre joins takes the fewest hops over the links there are.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oddl.controller.base.clock import Clock
from oddl.controller.base.jumps import JumpSet, jump_routes, totient_jumps
from oddl.controller.base.messages import Flow
from oddl.controller.base.parallelism import Hybrid
from oddl.sim.networks.electrical import FlowNetwork


@dataclass(frozen=True)
class Topology:
    """TopoOpt's topology for a hybrid-parallel job (its strategy fixed): a direct link for
    each model-parallel pair (tensor ring, pipeline neighbours), and TotientPerms' rings
    over each data-parallel group on the ports left; links as (rank, rank)."""

    links: tuple[tuple[int, int], ...]
    mp_ports: int
    dp_ports: int
    dp_jumps: tuple[int, ...]

    @classmethod
    def of(cls, h: Hybrid, degree: int) -> Topology:
        if h.mp_peers() > degree or (h.mp_peers() == degree and h.data > 1):
            raise ValueError(f"tensor {h.tensor} x pipeline {h.pipeline} needs "
                             f"{h.mp_peers()} model-parallel ports of {degree}: none is left "
                             f"for the data-parallel all-reduce")
        links: dict[tuple[int, int], None] = {}
        g = h.groups()
        for ring in g["tensor"]:
            for k, r in enumerate(ring if len(ring) > 1 else ()):
                links[(r, ring[(k + 1) % len(ring)])] = None
        for pipe in g["pipeline"]:
            for a, b in itertools.pairwise(pipe):
                links[(a, b)] = links[(b, a)] = None
        jumps = totient_jumps(h.data, h.dp_ports(degree)) if h.data > 1 else []
        for group in g["data"]:
            for k, r in enumerate(group):
                for j in jumps:
                    links[(r, group[(k + j) % len(group)])] = None
        return cls(tuple(links), h.mp_peers(), len(jumps), tuple(jumps))

    def describe(self) -> dict[str, object]:
        return {"links": len(self.links), "mp_ports": self.mp_ports,
                "dp_ports": self.dp_ports, "dp_jumps": list(self.dp_jumps)}


class TopoOpt(FlowNetwork):
    name = "topoopt"

    def __init__(self, clock: Clock, nodes: list[str], line_rate_gbps: float,
                 latency_ns: float, deliver: Callable[[Flow], None], degree: int = 4,
                 link_gbps: float | None = None, bidirectional: bool = False,
                 links: Sequence[tuple[str, str]] | None = None) -> None:
        """`links`: a topology of its own (a hybrid job's, `Topology`), each a one-way
        fibre between two nodes; default: TotientPerms' `degree` jumps over every node."""
        self.n = len(nodes)
        self.nodes = nodes
        self.pos = {n: i for i, n in enumerate(nodes)}
        self.link_gbps = link_gbps or line_rate_gbps
        self.hop_latency_ns = round(latency_ns)
        self.adj: list[list[int]] | None = None
        self._trees: dict[int, list[int]] = {}
        if links is None:
            self.jumps = totient_jumps(self.n, degree, bidirectional=bidirectional)
            self.routes: list[tuple[int, ...]] = jump_routes(self.n, self.jumps) \
                if self.n > 1 else [()]
            self.topology: JumpSet | None = JumpSet.of(self.n, self.jumps, self.routes)
            cap: dict[object, float] = {(i, j): self.link_gbps for i in range(self.n)
                                        for j in self.jumps}
        else:
            self.jumps, self.routes, self.topology = [], [], None
            self.adj = [[] for _ in nodes]
            cap = {}
            for a, b in links:
                i, j = self.pos[a], self.pos[b]
                self.adj[i].append(j)
                cap[("link", i, j)] = self.link_gbps
        super().__init__(clock, cap, self._path, latency_ns, deliver)

    def _next(self, dst: int) -> list[int]:
        """Each node's next hop toward dst on the fewest hops (-1: cannot reach it)."""
        tree = self._trees.get(dst)
        if tree is None:
            assert self.adj is not None
            radj: list[list[int]] = [[] for _ in self.adj]
            for i, outs in enumerate(self.adj):
                for j in outs:
                    radj[j].append(i)
            tree = [-1] * self.n
            tree[dst] = dst
            q = deque([dst])
            while q:
                v = q.popleft()
                for u in radj[v]:
                    if tree[u] < 0:
                        tree[u] = v
                        q.append(u)
            self._trees[dst] = tree
        return tree

    def _path(self, f: Flow) -> tuple[object, ...]:
        at = self.pos[f.src]
        links: list[object] = []
        if self.adj is not None:
            dst = self.pos[f.dst]
            tree = self._next(dst)
            if tree[at] < 0:
                raise ValueError(f"TopoOpt: {f.src} has no path to {f.dst} on the topology")
            while at != dst:
                links.append(("link", at, tree[at]))
                at = tree[at]
            return tuple(links)
        for j in self.routes[(self.pos[f.dst] - at) % self.n]:
            links.append((at, j))
            at = (at + j) % self.n
        return tuple(links)

    def describe(self) -> dict[str, int | float]:
        if self.topology is None:
            return {"links": len(self.capacity)}
        return {"diameter": self.topology.diameter,
                "mean_hops": round(self.topology.mean_hops, 3)}

    def hops(self, src: str, dst: str) -> int:
        if self.adj is not None:
            return len(self._path(Flow(0, src, dst, 0)))
        return len(self.routes[(self.pos[dst] - self.pos[src]) % self.n])

    def _latency(self, flow: Flow) -> int:
        return self.hops(flow.src, flow.dst) * self.hop_latency_ns
