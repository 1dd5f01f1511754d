"""The stage-1 plan as data: placement, WSS wavelength tables, node routes.

A plan prints as readable tables and as JSON, loads back from JSON, and validates itself
(no (out_port, wavelength) collision on any WSS; every communicating pair reaches its
destination along routes that agree with the WSS tables) before anything is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import msgspec
from oddl.controller.base.topology import Grid


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, one level deep (its lists shared, not copied)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


class PlanError(Exception):
    """A plan that must not be applied; the message says what and where."""


class Route(msgspec.Struct, frozen=True, gc=False):
    """A node's way toward a destination: the port and channel its light leaves on, and
    the node that takes it (the destination, or a relay). A frozen msgspec struct out of
    the collector's sight: a 4,096-node plan makes 49,152."""

    port: str  # "H" | "V"
    channel: int  # index into the testbed's wavelength list
    next_hop: str


@dataclass
class WSSTable:
    wss: str
    axis: str
    index: int
    ports: int
    # table[in_port][channel] -> out_port, or None where that input is blocked
    table: list[list[int | None]]
    labels: list[str]  # what each channel realizes, e.g. "shift+1", "xor2"

    def collisions(self) -> list[str]:
        out = []
        n_ch = len(self.labels)
        for ch in range(n_ch):
            seen: dict[int, int] = {}
            for i, row in enumerate(self.table):
                o = row[ch] if ch < len(row) else None
                if o is None:
                    continue
                if not 0 <= o < self.ports:
                    out.append(f"{self.wss}: input {i} channel {ch} -> port {o} does not exist")
                elif o == i:
                    out.append(f"{self.wss}: input {i} channel {ch} loops back to itself")
                elif o in seen:
                    out.append(f"{self.wss}: inputs {seen[o]} and {i} both reach (out {o}, "
                               f"channel {ch}): collision")
                else:
                    seen[o] = i
        return out


@dataclass
class JobPlacement:
    job: str
    ranks: list[str]  # ranks[i] = node id of rank i
    channels: list[int]  # wavelength channels reserved for this job


@dataclass
class Plan:
    testbed: str
    strategy: str
    relay: str
    wavelengths_nm: list[float]
    jobs: list[JobPlacement]
    wss: list[WSSTable]
    routes: dict[str, dict[str, Route]]  # node -> destination -> route
    demand: list[tuple[str, str]] = field(default_factory=list)  # communicating pairs

    # --- validation -------------------------------------------------------------------
    def validate(self, grid: Grid) -> None:
        problems: list[str] = []
        for t in self.wss:
            problems += t.collisions()
            if len(t.labels) > len(self.wavelengths_nm):
                problems.append(f"{t.wss}: uses {len(t.labels)} channels but the testbed has "
                                f"{len(self.wavelengths_nm)} wavelengths")
        by_id = {t.wss: t for t in self.wss}
        for src, dst in self.demand:
            try:
                self.path(grid, src, dst, by_id)
            except PlanError as e:
                problems.append(str(e))
                if len(problems) > 20:
                    break
        if problems:
            more = "" if len(problems) <= 20 else "\n... and more"
            raise PlanError("plan is invalid:\n  " + "\n  ".join(problems[:20]) + more)

    def path(self, grid: Grid, src: str, dst: str,
             by_id: dict[str, WSSTable] | None = None) -> list[str]:
        """Follow routes hop by hop, checking each hop against the WSS tables."""
        by_id = by_id or {t.wss: t for t in self.wss}
        hops = [src]
        node = src
        while node != dst:
            r = self.routes.get(node, {}).get(dst)
            if r is None:
                raise PlanError(f"{src} -> {dst}: no route at {node}")
            g = grid.group_of(node, r.port)
            table = by_id.get(g.wss or "")
            if table is None:
                raise PlanError(f"{src} -> {dst}: {node} port {r.port} has no WSS")
            i = grid.port_index(node, r.port)
            row = table.table[i] if i < len(table.table) else []
            out = row[r.channel] if r.channel < len(row) else None
            if out is None or g.members[out] != r.next_hop:
                raise PlanError(f"{src} -> {dst}: at {node} route says {r.port}/ch{r.channel} "
                                f"-> {r.next_hop} but {table.wss} sends it to "
                                f"{'nowhere' if out is None else g.members[out]}")
            node = r.next_hop
            hops.append(node)
            if len(hops) > len(grid.nodes) + 1:
                raise PlanError(f"{src} -> {dst}: routing loop {hops[:8]}...")
        return hops

    # --- several jobs ------------------------------------------------------------------
    def nodes(self) -> set[str]:
        """Every node this plan uses: ranks, relays, receivers."""
        out = {n for j in self.jobs for n in j.ranks} | set(self.routes)
        out |= {r.next_hop for rs in self.routes.values() for r in rs.values()}
        return out

    def rows(self, grid: Grid) -> dict[str, dict[int, list[int | None]]]:
        """Per WSS, the input rows of this plan's nodes: what admitting it writes (and
        what releasing it clears); no other input is touched."""
        mine = self.nodes()
        out: dict[str, dict[int, list[int | None]]] = {}
        for t in self.wss:
            g = grid.groups[(t.axis, t.index)]
            out[t.wss] = {i: t.table[i] for i, m in enumerate(g.members) if m in mine}
        return out

    def lights(self, grid: Grid) -> set[tuple[str, int, int]]:
        """The (WSS, output port, channel) this plan's light may take."""
        return {(w, o, ch) for w, rows in self.rows(grid).items() for row in rows.values()
                for ch, o in enumerate(row) if o is not None}

    def conflicts(self, other: Plan, grid: Grid) -> list[str]:
        """What this plan would share with another job's: a node (a rank, receiver or
        relay), or a (WSS output port, wavelength). Isolated jobs share nothing."""
        a, b = self.jobs[0].job, other.jobs[0].job
        out = [f"{a} and {b} both use node {n}" for n in sorted(self.nodes() & other.nodes())]
        out += [f"{a} and {b} both light {w} output {o} on channel {ch}"
                for w, o, ch in sorted(self.lights(grid) & other.lights(grid))]
        return out

    def degrees(self) -> dict[str, int]:
        """Each node's optical degree: the nodes its light reaches directly (the next hops
        of its routes, its own flows' and those it relays), as SiP-ML counts a GPU's
        lightpaths; every node of the plan, 0 for one that only receives."""
        out = dict.fromkeys(sorted(self.nodes()), 0)
        for n, rs in self.routes.items():
            out[n] = len({r.next_hop for r in rs.values()})
        return out

    # --- presentation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """As `from_dict` reads it (routes as [port, channel, next hop]); built field by
        field, sharing the tables' lists (`asdict` deep-copied 4096-node tables)."""
        return {"testbed": self.testbed, "strategy": self.strategy, "relay": self.relay,
                "wavelengths_nm": list(self.wavelengths_nm),
                "jobs": [_fields(j) for j in self.jobs], "wss": [_fields(t) for t in self.wss],
                "routes": {n: {dst: [r.port, r.channel, r.next_hop] for dst, r in rs.items()}
                           for n, rs in self.routes.items()},
                "demand": [list(p) for p in self.demand]}

    def to_json(self) -> str:
        """Indented, to be read and diffed; msgspec's encoder: the standard library's
        falls back to pure Python when indenting (0.9 s for grid-4096's plan)."""
        return msgspec.json.format(msgspec.json.encode(self.to_dict()), indent=1).decode()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(
            testbed=d["testbed"], strategy=d["strategy"], relay=d["relay"],
            wavelengths_nm=list(d["wavelengths_nm"]),
            jobs=[JobPlacement(**j) for j in d["jobs"]],
            wss=[WSSTable(**t) for t in d["wss"]],
            routes={n: {dst: Route(*r) for dst, r in rs.items()}
                    for n, rs in d["routes"].items()},
            demand=[tuple(p) for p in d["demand"]],
        )

    def summary_lines(self, max_wss: int = 4, max_nodes: int = 8) -> list[str]:
        L = [f"plan for {self.testbed}: strategy {self.strategy}, relay {self.relay}, "
             f"{len(self.wss)} WSSs, {sum(len(r) for r in self.routes.values())} routes, "
             f"{len(self.demand)} communicating pairs"]
        for j in self.jobs:
            L.append(f"job {j.job}: {len(j.ranks)} ranks on "
                     f"{', '.join(j.ranks[:6])}{' ...' if len(j.ranks) > 6 else ''}; "
                     f"channels {j.channels}")
        for t in self.wss[:max_wss]:
            L.append("")
            L.append(f"WSS {t.wss} ({t.axis} {t.index}, {t.ports} ports)")
            head = "  in " + "".join(
                f"| ch{c} {self.wavelengths_nm[c]:.3f}nm {t.labels[c]:<8}"
                for c in range(len(t.labels)))
            L.append(head)
            for i, row in enumerate(t.table):
                L.append(f"  {i:>3}" + "".join(
                    f"| {'-' if o is None else o:>4}{'':<{len(f' ch{c} {0:.3f}nm ') + 5}}"
                    for c, o in enumerate(row)))
        if len(self.wss) > max_wss:
            L.append(f"... {len(self.wss) - max_wss} more WSSs (use --json for all)")
        L.append("")
        L.append("routes (node -> destination: port/channel via next hop)")
        for n in list(self.routes)[:max_nodes]:
            rs = self.routes[n]
            L.append(f"  {n}: " + ", ".join(f"{d}:{r.port}/ch{r.channel}"
                                            f"{'' if r.next_hop == d else ' via ' + r.next_hop}"
                                            for d, r in list(rs.items())[:8])
                     + (" ..." if len(rs) > 8 else ""))
        if len(self.routes) > max_nodes:
            L.append(f"  ... {len(self.routes) - max_nodes} more nodes")
        return L
