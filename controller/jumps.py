"""Circulant jump sets: TopoOpt's TotientPerms choice of jumps and the hop counts they give.

Used by the planner (which shifts a group's wavelengths realise) and by the totient-rings
collective (which rings a job runs), so it sits below both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from math import gcd


def totient_jumps(n: int, d: int) -> list[int]:
    """d jumps coprime with n, spread geometrically between 1 and n - 1 (TopoOpt)."""
    tot = [k for k in range(1, n) if gcd(k, n) == 1]
    d = min(d, len(tot))
    if d <= 0:
        return []
    if d == len(tot):
        return tot
    targets = [1.0] if d == 1 else [(n - 1) ** (i / (d - 1)) for i in range(d)]
    chosen: list[int] = []
    for t in targets:
        free = [k for k in tot if k not in chosen]
        chosen.append(min(free, key=lambda k: (abs(k - t), k)))
    return sorted(chosen)


def circulant_distances(n: int, jumps: Iterable[int]) -> list[int]:
    """Hop counts from node 0 to every node over directed jumps (circulant graph)."""
    js = list(jumps)
    dist = [-1] * n
    dist[0] = 0
    q = deque([0])
    while q:
        u = q.popleft()
        for j in js:
            v = (u + j) % n
            if dist[v] < 0:
                dist[v] = dist[u] + 1
                q.append(v)
    return dist
