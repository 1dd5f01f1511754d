"""Stage 1 planning: which permutation each wavelength realizes on each WSS, and the routes.

A WSS channel is a partial permutation of its ports (input i -> output M[i]); three
strategies choose them:
- cyclic: channel k is the AWG-like shift i -> i + k (needs P - 1 wavelengths);
- matched: the permutations the job's collective actually uses, merged where they fit;
- totientperms: TopoOpt's regular permutations, jumps coprime with P chosen as TopoOpt's
  released code does (controller/base/jumps.py), for fewer wavelengths than shifts.
Routes follow shortest-path trees rooted at each destination, so every node's next hop
toward a destination is the same whoever the source is (routes agree along a path).

Around faults (`Avoid`: dead nodes, dead WSSs, receivers whose link corrupts) a pair goes
through the other dimension: the other relay order, or, for a pair in one row (column)
whose WSS or receiver is bad, down a column into another row and back. Which way a node
sends toward a destination depends on that node and destination only, so routes still
agree along every path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from oddl.controller.base.catalog import STRATEGIES
from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import Testbed
from oddl.controller.base.jumps import totient_jumps
from oddl.controller.base.topology import Grid, H, V
from oddl.controller.stage1.plan import JobPlacement, Plan, PlanError, Route, WSSTable

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


@dataclass(frozen=True)
class Avoid:
    """What a plan must route around: the arbiter's live inventory of faults."""

    nodes: frozenset[str] = field(default_factory=frozenset)  # dead: neither rank nor relay
    wss: frozenset[str] = field(default_factory=frozenset)  # dead or misrouting
    links: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # (node, port) rx

    def __bool__(self) -> bool:
        return bool(self.nodes or self.wss or self.links)

    def receives(self, node: str, port: str) -> bool:
        return node not in self.nodes and (node, port) not in self.links


NO_FAULTS = Avoid()
Leg = tuple[str, int, str, str]  # axis, group index, from node, to node


class _Paths:
    """Which way each node sends toward each destination, around what `Avoid` names."""

    def __init__(self, grid: Grid, avoid: Avoid, relay: str) -> None:
        self.grid, self.avoid, self.relay = grid, avoid, relay

    def _leg_ok(self, axis: str, idx: int, to: str) -> bool:
        g = self.grid.groups[(axis, idx)]
        return (g.wss is not None and g.wss not in self.avoid.wss
                and self.avoid.receives(to, H if axis == "row" else V))

    def _ok(self, legs: list[Leg]) -> bool:
        return all(self._leg_ok(a, i, to) for a, i, _f, to in legs)

    def options(self, node: str, dst: str) -> Iterator[list[Leg]]:
        """Every way through at most one detour, in order of preference; made as asked for
        (with nothing to go round, only the first is: the detours of a row are O(rows))."""
        at = self.grid.at
        (r, c), (rd, cd) = self.grid.coord[node], self.grid.coord[dst]
        if r == rd:
            yield [("row", r, node, dst)]
            for x in self._others(r, self.grid.rows):
                yield [("col", c, node, at[(x, c)]), ("row", x, at[(x, c)], at[(x, cd)]),
                       ("col", cd, at[(x, cd)], dst)]
        elif c == cd:
            yield [("col", c, node, dst)]
            for y in self._others(c, self.grid.cols):
                yield [("row", r, node, at[(r, y)]), ("col", y, at[(r, y)], at[(rd, y)]),
                       ("row", rd, at[(rd, y)], dst)]
        else:
            row_first = [("row", r, node, at[(r, cd)]), ("col", cd, at[(r, cd)], dst)]
            col_first = [("col", c, node, at[(rd, c)]), ("row", rd, at[(rd, c)], dst)]
            yield from ([row_first, col_first] if self.relay == "row-first"
                        else [col_first, row_first])

    @staticmethod
    def _others(k: int, n: int) -> Iterator[int]:
        return ((k + d) % n for d in range(1, n))

    def first(self, node: str, dst: str) -> Leg:
        """The first leg of the preferred way (what `legs(...)[0]` is with no faults),
        without the generator: a 4,096-node plan asks 100,000 times."""
        at = self.grid.at
        (r, c), (rd, cd) = self.grid.coord[node], self.grid.coord[dst]
        if r == rd:
            return ("row", r, node, dst)
        if c == cd:
            return ("col", c, node, dst)
        if self.relay == "row-first":
            return ("row", r, node, at[(r, cd)])
        return ("col", c, node, at[(rd, c)])

    def legs(self, node: str, dst: str) -> list[Leg]:
        opts = self.options(node, dst)
        first = next(opts)
        if not self.avoid or self._ok(first):
            return first
        for legs in opts:
            if self._ok(legs):
                return legs
        raise PlanError(f"{node} -> {dst}: no path around the faults ({self._why(first)})")

    def _why(self, legs: list[Leg]) -> str:
        for a, i, _f, to in legs:
            g = self.grid.groups[(a, i)]
            if g.wss is None or g.wss in self.avoid.wss:
                return f"{a} {i}'s WSS {g.wss or '(none)'} is out"
            if not self.avoid.receives(to, H if a == "row" else V):
                return f"{to} cannot receive on {H if a == 'row' else V}"
        return "every detour is blocked"


class _GroupRouting:
    """Next hop (channel, out port) toward every target port, from shortest-path trees;
    `blocked` ports (dead members) relay nothing."""

    def __init__(self, p: int, mappings: list[Mapping],
                 blocked: frozenset[int] = frozenset()) -> None:
        self.p = p
        self.blocked = blocked
        self.mappings = mappings
        # out -> (in, ch), each list in channel order (the lowest channel wins a tie)
        radj: list[list[tuple[int, int]]] = [[] for _ in range(p)]
        direct: dict[tuple[int, int], tuple[int, int]] = {}  # (in, out) -> its lowest hop
        for ch, m in enumerate(mappings):
            for i, o in m.items():
                radj[o].append((i, ch))
                direct.setdefault((i, o), (ch, o))
        self.radj = radj
        self.direct = direct
        self._trees: dict[int, list[tuple[int, int] | None]] = {}

    def next_hop(self, i: int, t: int) -> tuple[int, int] | None:
        # most demand is one hop (the channels are chosen from it): the tree's first level,
        # without building the tree (a 1,000-port row took 3 minutes of trees)
        hop = self.direct.get((i, t))
        if hop is not None:
            return hop
        tree = self._trees.get(t)
        if tree is None:
            tree = [None] * self.p
            seen = [False] * self.p
            seen[t] = True
            q = deque([t])
            while q:  # reverse BFS: who can reach t, and through which channel
                o = q.popleft()
                if o != t and o in self.blocked:
                    continue  # a dead member relays nothing
                for i2, ch in self.radj[o]:
                    if not seen[i2]:
                        seen[i2] = True
                        tree[i2] = (ch, o)
                        q.append(i2)
            self._trees[t] = tree
        return tree[i]


def plan_job(tb: Testbed, grid: Grid, schedule: Schedule, job: str = "job0",
             strategy: str = "matched", relay: str = "row-first",
             ranks: list[str] | None = None, avoid: Avoid = NO_FAULTS,
             within: frozenset[str] | None = None) -> Plan:
    """ranks: rank r's node (default: the grid's first len(schedule) nodes); within: the
    job's partition (controller/stage1/placement.py), beside other jobs: no channel entry leaves
    it, so its light reaches none of their receivers. In three parts: the demand on each
    group's WSS (`_demand`), each group's channel mappings (`_channels`), and the routes
    along every demand path over them (`_routes`)."""
    ranks = _ranks_of(tb, grid, schedule, job, strategy, relay, ranks, avoid)
    paths = _Paths(grid, avoid, relay)
    first_leg = paths.first if not avoid else (lambda n, d: paths.legs(n, d)[0])
    wl = tb.optical.wavelengths()
    demand, per_group = _demand(grid, schedule, ranks, first_leg)
    routing, tables, used_channels = _channels(tb, grid, per_group, strategy, len(wl), avoid,
                                               within)
    routes = _routes(grid, demand, routing, first_leg, strategy)
    return Plan(tb.name, strategy, relay, wl,
                [JobPlacement(job, list(ranks), list(range(used_channels)))],
                tables, routes, sorted(demand))


def _ranks_of(tb: Testbed, grid: Grid, schedule: Schedule, job: str, strategy: str,
              relay: str, ranks: list[str] | None, avoid: Avoid) -> list[str]:
    """The job's ranks' nodes, its strategy and relay checked."""
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if relay not in ("row-first", "col-first"):
        raise PlanError(f"relay must be row-first or col-first, not {relay!r}")
    n = len(schedule)
    if n > len(grid.nodes):
        raise PlanError(f"job {job} has {n} ranks but {tb.name} has {len(grid.nodes)} nodes")
    ranks = list(grid.nodes[:n]) if ranks is None else list(ranks)
    if len(ranks) != n or len(set(ranks)) != n or not set(ranks) <= set(grid.coord):
        raise PlanError(f"job {job}: {n} ranks need {n} distinct nodes of {tb.name}, got "
                        f"{ranks[:8]}")
    dead = sorted(set(ranks) & avoid.nodes)
    if dead:
        raise PlanError(f"job {job}: rank on dead node {', '.join(dead)}")
    return ranks


FirstLeg = Callable[[str, str], Leg]
# per group (axis, index): each step pattern's in -> out pairs, and its bytes
Patterns = dict[tuple[str, int], dict[int, tuple[Mapping, int]]]


def _demand(grid: Grid, schedule: Schedule, ranks: list[str], first_leg: FirstLeg
            ) -> tuple[set[tuple[str, str]], Patterns]:
    """The (src, dst) pairs that talk, and per group and per step which in -> out pairs each
    step asks of its WSS (a pair's first step decides which step pattern it joins; its bytes
    are all its steps')."""
    coord = grid.coord
    demand: set[tuple[str, str]] = set()
    per_group: Patterns = {}
    outs: dict[tuple[str, int, int], set[int]] = {}  # each pattern's outputs taken

    def want(axis: str, idx: int, step: int, i: int, o: int, nbytes: int) -> None:
        steps = per_group.setdefault((axis, idx), {})
        m, w = steps.get(step, ({}, 0))
        taken = outs.setdefault((axis, idx, step), set())
        k = 0
        while m.get(i, o) != o or (i not in m and o in taken):
            # one input to two outputs, or two inputs to one output (incast): a channel
            # cannot do either, so this pair joins a sibling pattern of the same step
            k += 1
            m, w = steps.get(step + 1_000_000 * k, ({}, 0))
            taken = outs.setdefault((axis, idx, step + 1_000_000 * k), set())
        step = step + 1_000_000 * k
        m[i] = o
        taken.add(o)
        steps[step] = (m, w + nbytes)

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
        node, legs_taken = src, 0
        while node != dst:  # leg by leg, as each node on the way will send it
            axis, idx, _a, to = first_leg(node, dst)
            k = 1 if axis == "row" else 0
            want(axis, idx, s, coord[node][k], coord[to][k], nbytes)
            node, legs_taken = to, legs_taken + 1
            if legs_taken > 4:
                raise PlanError(f"{src} -> {dst}: no loop-free path around the faults")
    return demand, per_group


def _channels(tb: Testbed, grid: Grid, per_group: Patterns, strategy: str, w_count: int,
              avoid: Avoid, within: frozenset[str] | None
              ) -> tuple[dict[tuple[str, int], _GroupRouting], list[WSSTable], int]:
    """Each group's channel mappings by the strategy (its routing, its WSS's table), and
    the most channels a group uses."""
    routing: dict[tuple[str, int], _GroupRouting] = {}
    cache: dict[tuple[tuple[tuple[tuple[int, int], ...], ...], frozenset[int]],
                _GroupRouting] = {}
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
        if within is not None:
            own = {i for i, m in enumerate(g.members) if m in within}
            mappings = [f for f in ({i: o for i, o in m.items() if i in own and o in own}
                                    for m in mappings) if f]
        port = H if g.axis == "row" else V
        blocked = frozenset(i for i, m in enumerate(g.members) if not avoid.receives(m, port))
        sig = (tuple(tuple(sorted(m.items())) for m in mappings), blocked)
        gr = cache.get(sig)
        if gr is None:
            gr = cache[sig] = _GroupRouting(p, mappings, blocked)
        routing[key] = gr
        used_channels = max(used_channels, len(mappings))
        table: list[list[int | None]] = [[m.get(i) for m in mappings] for i in range(g.ports)]
        tables.append(WSSTable(g.wss, g.axis, g.index, g.ports, table,
                               [_label(m, p) for m in mappings]))
    return routing, tables, used_channels


def _routes(grid: Grid, demand: set[tuple[str, str]],
            routing: dict[tuple[str, int], _GroupRouting], first_leg: FirstLeg,
            strategy: str) -> dict[str, dict[str, Route]]:
    """Every node's route to each destination along every demand path."""
    coord = grid.coord
    routes: dict[str, dict[str, Route]] = {}

    def route(node: str, dst: str) -> Route:
        axis, idx, _a, to = first_leg(node, dst)
        k = 1 if axis == "row" else 0
        key, port, i, t = (axis, idx), H if axis == "row" else V, coord[node][k], coord[to][k]
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
            if hops > len(grid.nodes) + 4:
                raise PlanError(f"{src} -> {dst}: routing loop")
    return routes
