"""Where a job runs: a rectangle of free nodes on the grid (ODDL stage 1, several jobs).

A job gets a row segment, a column segment or a sub-grid. A rectangle is closed under
relaying: a row-first (or column-first) relay between two of its nodes, (r_src, c_dst), is
one of its nodes too, so no job's light ever passes through another job's node, and its
WSS entries sit on its own ports only (ports are nodes). Ranks fill the rectangle row by
row: halving-doubling's partners (rank XOR 2^k) are then one hop apart, in a row for the
low bits and in a column for the high ones, and a sub-grid gives 2-D hierarchical its rows
and columns. A rank count no rectangle fits exactly (a prime over the grid's side) takes
the smallest rectangle that holds it; its last row's spare cells stay with the job, as
relays only, until it leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from oddl.controller.base.topology import Grid


@dataclass(frozen=True)
class Partition:
    """A job's nodes: rows x cols of the grid; ranks[i] is rank i's node (row-major over
    the rectangle), `spare` the reserved cells past the last rank."""

    job: str
    shape: str  # "row" | "col" | "grid"
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    ranks: tuple[str, ...]
    spare: tuple[str, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.ranks + self.spare

    def describe(self) -> str:
        r0, c0 = self.rows[0], self.cols[0]
        extra = f" (+{len(self.spare)} spare)" if self.spare else ""
        return (f"{self.job}: {len(self.ranks)} ranks{extra}, {self.shape} "
                f"{len(self.rows)} x {len(self.cols)} at row {r0}, col {c0}")


def _shapes(ranks: int, rows: int, cols: int, hint: str, exact: bool,
            group: int = 1) -> list[tuple[int, int]]:
    """Rectangles (r, c) that hold `ranks`, best first: a row segment, a column segment,
    then sub-grids nearest to square with least waste; `exact`: no spare cells (2-D
    hierarchical needs its whole rectangle); `group`: each run of that many consecutive
    ranks (a hybrid job's tensor group) keeps to one row."""
    out: list[tuple[int, int]] = []
    if hint in ("any", "row") and ranks <= cols:
        out.append((1, ranks))
    if hint in ("any", "col") and ranks <= rows and ranks > 1 and group == 1:
        out.append((ranks, 1))
    if hint in ("any", "grid"):
        grids = []
        for r in range(2, rows + 1):
            c = -(-ranks // r)
            if c < 2 or c > cols or (exact and r * c != ranks) or r * c - ranks >= c \
                    or c % group:
                continue
            grids.append((r * c - ranks, abs(r - c), -c, r, c))
        out += [(r, c) for *_k, r, c in sorted(grids)]
    return out


def place(grid: Grid, free: set[str], job: str, ranks: int, hint: str = "any",
          exact: bool = False, group: int = 1) -> Partition | None:
    """The first free rectangle of the best shape for `ranks` nodes, or None (the job
    waits). First fit, scanning rows then columns, on a summed-area table of free cells."""
    found = candidates(grid, free, job, ranks, hint, exact, group, limit=1)
    return found[0] if found else None


def candidates(grid: Grid, free: set[str], job: str, ranks: int, hint: str = "any",
               exact: bool = False, group: int = 1, limit: int = 4) -> list[Partition]:
    """Up to `limit` free rectangles for the job, `place`'s choice first, then others
    spread over the free positions of each shape: what CASSINI's placement chooses among
    (controller/service/compat.best_placement)."""
    R, C = grid.rows, grid.cols
    occ = np.zeros((R + 1, C + 1), dtype=np.int32)
    for n in grid.nodes:
        if n not in free:
            r, c = grid.coord[n]
            occ[r + 1, c + 1] = 1
    occ = occ.cumsum(0).cumsum(1)
    out: list[Partition] = []
    for h, w in _shapes(ranks, R, C, hint, exact, group):
        busy = occ[h:, w:] - occ[:-h, w:] - occ[h:, :-w] + occ[:-h, :-w]
        hits = np.argwhere(busy == 0)
        for k in range(0, len(hits), max(1, len(hits) // limit)):
            r0, c0 = (int(x) for x in hits[k])
            cells = [grid.at[(r0 + i, c0 + j)] for i in range(h) for j in range(w)]
            shape = "row" if h == 1 else "col" if w == 1 else "grid"
            out.append(Partition(job, shape, tuple(range(r0, r0 + h)),
                                 tuple(range(c0, c0 + w)), tuple(cells[:ranks]),
                                 tuple(cells[ranks:])))
            if len(out) >= limit:
                return out
    return out


def fits(grid: Grid, ranks: int, hint: str = "any", exact: bool = False,
         group: int = 1) -> bool:
    """Whether the job fits the empty grid at all (else it could never start)."""
    return bool(_shapes(ranks, grid.rows, grid.cols, hint, exact, group))
