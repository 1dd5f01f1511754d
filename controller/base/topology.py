"""The 2-D grid: node coordinates, row/column groups and which WSS port a node sits on."""

from __future__ import annotations

from dataclasses import dataclass, field

from oddl.controller.base.config import Testbed

H, V = "H", "V"  # optical ports: H to the row WSS, V to the column WSS


@dataclass(frozen=True, slots=True)
class Group:
    """One row or column: the nodes on one WSS, in WSS port order."""

    axis: str  # "row" | "col"
    index: int
    wss: str | None
    ports: int
    members: tuple[str, ...]

    @property
    def port_kind(self) -> str:
        return H if self.axis == "row" else V


@dataclass
class Grid:
    rows: int
    cols: int
    nodes: list[str]  # row-major
    coord: dict[str, tuple[int, int]]
    at: dict[tuple[int, int], str]
    groups: dict[tuple[str, int], Group] = field(default_factory=dict)

    @classmethod
    def from_testbed(cls, tb: Testbed) -> Grid:
        at = {(n.row, n.col): n.id for n in tb.nodes}
        nodes = [at[(r, c)] for r in range(tb.grid.rows) for c in range(tb.grid.cols)]
        coord = {n: rc for rc, n in at.items()}
        wss = {(w.axis, w.index): w for w in tb.wss}
        g = cls(tb.grid.rows, tb.grid.cols, nodes, coord, at)
        for r in range(tb.grid.rows):
            w = wss.get(("row", r))
            members = tuple(at[(r, c)] for c in range(tb.grid.cols))
            g.groups[("row", r)] = Group("row", r, w.id if w else None,
                                         w.ports if w else len(members), members)
        for c in range(tb.grid.cols):
            w = wss.get(("col", c))
            members = tuple(at[(r, c)] for r in range(tb.grid.rows))
            g.groups[("col", c)] = Group("col", c, w.id if w else None,
                                         w.ports if w else len(members), members)
        return g

    def group_of(self, node: str, port: str) -> Group:
        r, c = self.coord[node]
        return self.groups[("row", r)] if port == H else self.groups[("col", c)]

    def wss_of(self) -> dict[tuple[str, str], str]:
        """(node, port) -> the WSS that port's light goes through."""
        return {(n, p): g.wss for n in self.nodes for p in (H, V)
                if (g := self.group_of(n, p)).wss is not None}

    def port_index(self, node: str, port: str) -> int:
        """Which WSS port the node's H or V fibre lands on (its column or row)."""
        r, c = self.coord[node]
        return c if port == H else r
