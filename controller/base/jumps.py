"""Circulant jump sets: TopoOpt's TotientPerms choice of jumps, and routes over them.

Follows TopoOpt's released code (hipersys-team/FlexFlow `src/runtime/network.cc`:
`construct_candidate_jumps`, `choose_n_geo`, `add_ring`, `all_coin_change`), step by
step, so our baseline is theirs and not a paraphrase of the paper. Used by the planner
(which shifts a group's wavelengths realise), by the totient-rings collective and by the
TopoOpt network, so it sits below all three.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from math import gcd


def candidate_jumps(n: int, group: int | None = None) -> list[int]:
    """C_g = {(n/g)·k : 1 <= k <= g, gcd(k, g) = 1} for a data-parallel group of size g
    dividing n (`construct_candidate_jumps`); g = n for a job over all n nodes."""
    g = n if group is None else group
    if g < 2 or n % g:
        raise ValueError(f"group size {g} must be at least 2 and divide {n}")
    base = n // g
    return [base * k for k in range(1, g + 1) if gcd(k, g) == 1]


def totient_jumps(n: int, d: int, group: int | None = None,
                  bidirectional: bool = False) -> list[int]:
    """The jumps a degree-d node gets, sorted (`choose_n_geo`).

    m = d jumps (d // 2 in bidirectional mode, each with its reverse n - j, as `add_ring`
    lays both directions). The walk starts at the smallest candidate and multiplies the
    target by r = (max C / min C)^(1/(m-1)), or ^(1/m) in bidirectional mode, taking the
    smallest unused candidate at or above the target each time (a lower bound, not the
    nearest). Where the released code would read past the last candidate (a target above
    it by rounding, or m > |C|), we take the largest unused one and cap m at |C|.
    """
    if n < 2 or d < 1:
        return []
    if bidirectional and d < 2:
        raise ValueError(f"bidirectional TotientPerms needs degree >= 2, not {d}")
    cands = candidate_jumps(n, group)
    m = min(d // 2 if bidirectional else d, len(cands))
    if m == 1:
        chosen = {cands[0]}
    else:
        ratio = (cands[-1] / cands[0]) ** (1 / (m if bidirectional else m - 1))
        chosen = set()
        target = float(cands[0])
        for _ in range(m):
            i = bisect_left(cands, target)
            while i < len(cands) and cands[i] in chosen:
                i += 1
            if i == len(cands):
                i = max(k for k, c in enumerate(cands) if c not in chosen)
            chosen.add(cands[i])
            target *= ratio
    if bidirectional:
        chosen |= {n - j for j in chosen}
    return sorted(chosen)


def jump_routes(n: int, jumps: list[int]) -> list[tuple[int, ...]]:
    """For every offset 0..n-1, a fewest-jumps sequence reaching it from 0: the coin-change
    problem over the jump set mod n (`all_coin_change`), solved breadth-first; ties go to
    the earlier jump in `jumps`. The graph is circulant, so one table serves every node."""
    route: list[tuple[int, ...] | None] = [None] * n
    route[0] = ()
    q = deque([0])
    while q:
        u = q.popleft()
        for j in jumps:
            v = (u + j) % n
            if route[v] is None:
                route[v] = (*route[u], j)  # type: ignore[misc]  # u was reached: its route is set
                q.append(v)
    missing = [v for v in range(n) if route[v] is None]
    if missing:
        raise ValueError(f"jumps {jumps} do not connect {n} nodes (offset {missing[0]})")
    return route  # type: ignore[return-value]  # every node is reached (jumps generate the group)


@dataclass(frozen=True, slots=True)
class JumpSet:
    """A circulant topology and what it costs a flow: printed by `oddl plan` and TopoOpt."""

    n: int
    jumps: tuple[int, ...]
    diameter: int
    mean_hops: float  # over all ordered pairs of distinct nodes

    @classmethod
    def of(cls, n: int, jumps: list[int],
           routes: list[tuple[int, ...]] | None = None) -> JumpSet:
        """`routes`: jump_routes(n, jumps), where the caller has them already."""
        if routes is None:
            routes = jump_routes(n, jumps) if n > 1 else [()]
        hops = [len(r) for r in routes]
        return cls(n, tuple(jumps), max(hops), sum(hops) / max(1, n - 1))

    def __str__(self) -> str:
        d = len(self.jumps)
        bound = d * self.n ** (1 / d) if d else 0.0
        return (f"N={self.n} jumps {list(self.jumps)}: diameter {self.diameter}, mean "
                f"{self.mean_hops:.2f} hops (d·N^(1/d) = {bound:.1f})")
