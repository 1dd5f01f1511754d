"""A two-tier leaf-spine fat-tree (folded Clos) as a flow-level baseline.

`hosts_per_leaf` hosts hang off each leaf switch at the line rate; each leaf has one uplink
to each of `spines` spine switches. The oversubscription ratio sets the uplink rate:
uplink = hosts_per_leaf x line rate / (spines x oversubscription); 1.0 is non-blocking in
capacity. A flow between leaves takes one spine chosen by ECMP, a hash of (src, dst): a
collective keeps one connection per peer, and ECMP hashes a connection's 5-tuple, so two
peers' flows always share a path while different peers' flows can collide on a spine link
as they do in a real fabric (and the choice does not depend on event order).
Rates are max-min fair on every link; each switch on the path adds `latency_ns`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.networks.electrical import FlowNetwork


class FatTree(FlowNetwork):
    name = "fattree"

    def __init__(self, clock: Clock, nodes: list[str], rate_gbps: float, latency_ns: float,
                 deliver: Callable[[Flow], None], hosts_per_leaf: int, spines: int,
                 oversubscription: float = 1.0) -> None:
        if hosts_per_leaf < 1 or spines < 1 or oversubscription <= 0:
            raise ValueError("fat-tree needs hosts_per_leaf >= 1, spines >= 1, "
                             "oversubscription > 0")
        self.leaf = {n: i // hosts_per_leaf for i, n in enumerate(nodes)}
        self.leaves = math.ceil(len(nodes) / hosts_per_leaf)
        self.spines = spines
        self.uplink_gbps = hosts_per_leaf * rate_gbps / (spines * oversubscription)
        cap: dict[object, float] = {}
        for n in nodes:
            cap[("up", n)] = rate_gbps
            cap[("down", n)] = rate_gbps
        for leaf in range(self.leaves):
            for s in range(spines):
                cap[("l2s", leaf, s)] = self.uplink_gbps
                cap[("s2l", s, leaf)] = self.uplink_gbps
        self.switch_latency_ns = math.ceil(latency_ns)
        super().__init__(clock, cap, self._path, latency_ns, deliver)

    def spine_of(self, flow: Flow) -> int:
        return zlib.crc32(f"{flow.src}>{flow.dst}".encode()) % self.spines

    def _path(self, f: Flow) -> tuple[object, ...]:
        ls, ld = self.leaf[f.src], self.leaf[f.dst]
        if ls == ld:
            return (("up", f.src), ("down", f.dst))
        s = self.spine_of(f)
        return (("up", f.src), ("l2s", ls, s), ("s2l", s, ld), ("down", f.dst))

    def _latency(self, flow: Flow) -> int:
        hops = 1 if self.leaf[flow.src] == self.leaf[flow.dst] else 3
        return hops * self.switch_latency_ns
