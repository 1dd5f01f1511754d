"""Stage 1 planning: which permutation each wavelength realizes on each WSS, and the routes.

A WSS channel is a partial permutation of its ports (input i -> output M[i]); three
strategies choose them:
- cyclic: channel k is the AWG-like shift i -> i + k (needs P - 1 wavelengths);
- matched: the permutations the job's collective actually uses, merged where they fit;
- totientperms: TopoOpt's regular permutations, jumps k with gcd(k, P) = 1 spread
  geometrically between 1 and P - 1, for fewer wavelengths than shifts.
Routes follow shortest-path trees rooted at each destination, so every node's next hop
toward a destination is the same whoever the source is (routes agree along a path).
"""

from __future__ import annotations

from collections import deque

from oddl.controller.catalog import STRATEGIES
from oddl.controller.collectives import Schedule
from oddl.controller.config import Testbed
from oddl.controller.jumps import totient_jumps
from oddl.controller.plan import JobPlacement, Plan, PlanError, Route, WSSTable
from oddl.controller.topology import Grid, H, V

Mapping = dict[int, int]  # in port -> out port (partial permutation)


def _shift(p: int, k: int) -> Mapping:
    return {i: (i + k) % p for i in range(p)}


def _label(m: Mapping, p: int) -> str:
    if len(m) == p:
        ks = {(o - i) % p for i, o in m.items()}
        if len(ks) == 1:
            return f"shift+{ks.pop()}"
        xs = {i ^ o for i, o in m.items()}
        if len(xs) == 1:
            return f"xor{xs.pop()}"
    return f"perm{len(m)}"


def _merge(mappings: list[tuple[Mapping, int]]) -> list[tuple[Mapping, int]]:
    """Greedy union of compatible partial permutations (heaviest first)."""
    out: list[tuple[Mapping, int]] = []
    for m, w in sorted(mappings, key=lambda mw: (-mw[1], -len(mw[0]), sorted(mw[0].items()))):
        for k, (acc, aw) in enumerate(out):
            if all(acc.get(i, o) == o for i, o in m.items()):
                used_out = {o for i, o in acc.items() if i not in m}
                if not any(o in used_out for o in m.values()):
                    out[k] = ({**acc, **m}, aw + w)
                    break
        else:
            out.append((dict(m), w))
    return out


class _GroupRouting:
    """Next hop (channel, out port) toward every target port, from shortest-path trees."""

    def __init__(self, p: int, mappings: list[Mapping]) -> None:
        self.p = p
        self.mappings = mappings
        radj: list[list[tuple[int, int]]] = [[] for _ in range(p)]  # out -> (in, ch)
        for ch, m in enumerate(mappings):
            for i, o in m.items():
                radj[o].append((i, ch))
        self.radj = radj
        self._trees: dict[int, list[tuple[int, int] | None]] = {}

    def next_hop(self, i: int, t: int) -> tuple[int, int] | None:
        tree = self._trees.get(t)
        if tree is None:
            tree = [None] * self.p
            seen = [False] * self.p
            seen[t] = True
            q = deque([t])
            while q:  # reverse BFS: who can reach t, and through which channel
                o = q.popleft()
                for i2, ch in sorted(self.radj[o], key=lambda x: x[1]):
                    if not seen[i2]:
                        seen[i2] = True
                        tree[i2] = (ch, o)
                        q.append(i2)
            self._trees[t] = tree
        return tree[i]


def plan_job(tb: Testbed, grid: Grid, schedule: Schedule, job: str = "job0",
             strategy: str = "matched", relay: str = "row-first") -> Plan:
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if relay not in ("row-first", "col-first"):
        raise PlanError(f"relay must be row-first or col-first, not {relay!r}")
    n = len(schedule)
    if n > len(grid.nodes):
        raise PlanError(f"job {job} has {n} ranks but {tb.name} has {len(grid.nodes)} nodes")
    ranks = grid.nodes[:n]
    coord = grid.coord
    wl = tb.optical.wavelengths()
    w_count = len(wl)

    # demand, per group and per step: which in->out pairs each step asks of each WSS
    demand: set[tuple[str, str]] = set()
    per_group: dict[tuple[str, int], dict[int, tuple[Mapping, int]]] = {}

    def want(axis: str, idx: int, step: int, i: int, o: int, nbytes: int) -> None:
        steps = per_group.setdefault((axis, idx), {})
        m, w = steps.get(step, ({}, 0))
        k = 0
        while m.get(i, o) != o or (i not in m and o in m.values()):
            # one input to two outputs, or two inputs to one output (incast): a channel
            # cannot do either, so this pair joins a sibling pattern of the same step
            k += 1
            m, w = steps.get(step + 1_000_000 * k, ({}, 0))
        step = step + 1_000_000 * k
        m[i] = o
        steps[step] = (m, w + nbytes)

    # a pair's first step decides which step pattern it joins; its bytes are all its steps'
    first: dict[tuple[str, str], int] = {}
    weight: dict[tuple[str, str], int] = {}
    for r, steps in enumerate(schedule):
        src = ranks[r]
        for s, st in enumerate(steps):
            for dst_rank, nbytes in st.sends:
                pair = (src, ranks[dst_rank])
                if pair not in first:
                    first[pair] = s
                    weight[pair] = 0
                weight[pair] += nbytes
    for (src, dst), s in first.items():
        if dst == src:
            continue
        nbytes = weight[(src, dst)]
        demand.add((src, dst))
        rs, cs = coord[src]
        rd, cd = coord[dst]
        if rs == rd:
            want("row", rs, s, cs, cd, nbytes)
        elif cs == cd:
            want("col", cs, s, rs, rd, nbytes)
        elif relay == "row-first":
            want("row", rs, s, cs, cd, nbytes)
            want("col", cd, s, rs, rd, nbytes)
        else:
            want("col", cs, s, rs, rd, nbytes)
            want("row", rd, s, cs, cd, nbytes)

    # channel mappings per group
    routing: dict[tuple[str, int], _GroupRouting] = {}
    cache: dict[tuple[tuple[tuple[int, int], ...], ...], _GroupRouting] = {}
    tables: list[WSSTable] = []
    used_channels = 0
    for key in sorted(per_group):
        g = grid.groups[key]
        p = len(g.members)
        if g.wss is None:
            raise PlanError(f"{key[0]} {key[1]} carries traffic but has no WSS")
        if strategy == "cyclic":
            if p - 1 > w_count:
                raise PlanError(
                    f"cyclic needs P - 1 = {p - 1} wavelengths on {g.wss} but {tb.name} has "
                    f"{w_count}; use strategy 'matched' or 'totientperms'")
            mappings = [_shift(p, k) for k in range(1, p)]
        elif strategy == "totientperms":
            mappings = [_shift(p, k) for k in totient_jumps(p, w_count)]
        else:
            merged = _merge(list(per_group[key].values()))
            if len(merged) > w_count:
                # pairs grouped by shift always fit in P - 1 channels; use that if smaller
                by_shift: dict[int, tuple[Mapping, int]] = {}
                for m, wgt in per_group[key].values():
                    for i, o in m.items():
                        bm, bw = by_shift.setdefault((o - i) % p, ({}, 0))
                        bm[i] = o
                        by_shift[(o - i) % p] = (bm, bw + wgt // max(1, len(m)))
                if len(by_shift) < len(merged):
                    merged = sorted(by_shift.values(), key=lambda mw: -mw[1])
            mappings = [m for m, _ in merged[:w_count]]
        sig = tuple(tuple(sorted(m.items())) for m in mappings)
        gr = cache.get(sig)
        if gr is None:
            gr = cache[sig] = _GroupRouting(p, mappings)
        routing[key] = gr
        used_channels = max(used_channels, len(mappings))
        table: list[list[int | None]] = [[m.get(i) for m in mappings] for i in range(g.ports)]
        tables.append(WSSTable(g.wss, g.axis, g.index, g.ports, table,
                               [_label(m, p) for m in mappings]))

    # routes along every demand path
    routes: dict[str, dict[str, Route]] = {}

    def route(node: str, dst: str) -> Route:
        (r, c), (rd, cd) = coord[node], coord[dst]
        if r == rd or (c != cd and relay == "row-first"):
            key, port, i, t = ("row", r), H, c, cd
        else:
            key, port, i, t = ("col", c), V, r, rd
        gr = routing.get(key)
        hop = gr.next_hop(i, t) if gr else None
        if hop is None:
            raise PlanError(f"{node} -> {dst}: {key[0]} {key[1]} has no path from port {i} to "
                            f"port {t} with the {strategy} channels")
        ch, o = hop
        return Route(port, ch, grid.groups[key].members[o])

    for src, dst in sorted(demand):
        node = src
        hops = 0
        while node != dst:
            rs_ = routes.setdefault(node, {})
            rt = rs_.get(dst)
            if rt is None:
                rt = rs_[dst] = route(node, dst)
            node = rt.next_hop
            hops += 1
            if hops > len(grid.nodes):
                raise PlanError(f"{src} -> {dst}: routing loop")

    return Plan(tb.name, strategy, relay, wl,
                [JobPlacement(job, list(ranks), list(range(used_channels)))],
                tables, routes, sorted(demand))
