"""Stage 1, the central arbiter: inventory, plan, apply, read back, and only then go.

It talks to devices only through `controller.devices` interfaces and never sits in the
per-flow path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import Testbed
from oddl.controller.base.devices import DeviceRefused, ONic, WSSDevice
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.plan import Plan
from oddl.controller.stage1.planner import NO_FAULTS, Avoid, plan_job
from oddl.fpga.countaction import CountActionError, Program


class InventoryError(RuntimeError):
    pass


class ApplyError(RuntimeError):
    pass


class DeviceFailed(ApplyError):
    """A device did not take its part of the plan (no answer, an error): which one."""

    def __init__(self, what: str, target: str, error: BaseException) -> None:
        super().__init__(f"{what} {target}: {error}")
        self.what, self.target = what, target


@dataclass
class Inventory:
    boards: dict[str, dict[str, str]] = field(default_factory=dict)
    wss: dict[str, str] = field(default_factory=dict)
    wavelengths: int = 0


@contextlib.contextmanager
def _device(what: str, target: str) -> Iterator[None]:
    try:
        yield
    except (OSError, TimeoutError, DeviceRefused) as e:  # what a device that fails raises
        raise DeviceFailed(what, target, e) from e


class Arbiter:
    def __init__(self, tb: Testbed, grid: Grid, onics: Mapping[str, ONic],
                 wss: Mapping[str, WSSDevice]) -> None:
        self.tb = tb
        self.grid = grid
        self.onics = onics
        self.wss = wss
        self.live: dict[str, Plan] = {}  # jobs admitted beside each other, by name

    def inventory(self) -> Inventory:
        inv = Inventory(wavelengths=len(self.tb.optical.wavelengths()))
        problems = []
        for n in self.tb.nodes:
            board = self.onics.get(n.id)
            if board is None:
                problems.append(f"node {n.id}: no O-NIC answers")
                continue
            inv.boards[n.id] = board.identity()  # held to the design version when opened
        for w in self.tb.wss:
            wss = self.wss.get(w.id)
            if wss is None:
                problems.append(f"WSS {w.id}: does not answer")
                continue
            inv.wss[w.id] = wss.identify()
        if problems:
            raise InventoryError("inventory failed:\n  " + "\n  ".join(problems))
        return inv

    def plan(self, schedule: Schedule, strategy: str, job: str = "job0",
             relay: str = "row-first", ranks: list[str] | None = None,
             avoid: Avoid = NO_FAULTS, within: frozenset[str] | None = None) -> Plan:
        plan = plan_job(self.tb, self.grid, schedule, job, strategy, relay, ranks, avoid,
                        within)
        plan.validate(self.grid)
        return plan

    def apply(self, plan: Plan, programs: dict[str, Program] | None = None) -> None:
        """WSS tables, routes and count-action programs in; everything read back."""
        plan.validate(self.grid)
        for t in plan.wss:
            with _device("WSS", t.wss):
                self.wss[t.wss].set_table(t.table)
        self._load(plan, programs)
        self.verify(plan, programs)

    def admit(self, plan: Plan, programs: dict[str, Program] | None = None) -> None:
        """One job beside the running ones (ODDL stage 1 with several jobs): refused if it
        would share a node or a (WSS port, wavelength) with any of them; only its own WSS
        inputs, routes and programs are written, the others' light is not touched; then
        every running job's entries are read back too, unchanged."""
        job = plan.jobs[0].job
        plan.validate(self.grid)
        clash = [c for other in self.live.values() for c in plan.conflicts(other, self.grid)]
        if job in self.live or clash:
            raise ApplyError(f"job {job} is not isolated: " + (
                "; ".join(clash[:5]) if clash else "a job of that name is running"))
        for wss, rows in plan.rows(self.grid).items():
            with _device("WSS", wss):
                self.wss[wss].set_rows(rows)
        self._load(plan, programs)
        self.live[job] = plan
        tables = {w: self.wss[w].get_table()  # each WSS read once, for every job on it
                  for w in {t.wss for p in self.live.values() for t in p.wss}}
        for p in self.live.values():
            self.verify(p, programs if p is plan else None, tables)

    def tables(self) -> dict[str, list[list[int | None]]]:
        """What each WSS in use holds, every running job's inputs together (what the watch
        polls for); inputs no job owns are blocked."""
        out: dict[str, list[list[int | None]]] = {}
        for p in self.live.values():
            for t in p.wss:
                out.setdefault(t.wss, [[None] * len(r) for r in t.table])
            for w, rows in p.rows(self.grid).items():
                for i, row in rows.items():
                    out[w][i] = list(row)
        return out

    def release(self, job: str, gone: Avoid = NO_FAULTS) -> list[DeviceFailed]:
        """A job has left: its WSS inputs blocked, its nodes' routes cleared; its nodes and
        channels are free for the next. The devices in `gone` (dead, out) are not asked;
        one that fails to answer is skipped (it holds no light either) and returned, for
        the watch to be told, and the others are released all the same."""
        plan = self.live.pop(job)
        failed: list[DeviceFailed] = []
        for wss, rows in plan.rows(self.grid).items():
            if wss in gone.wss:
                continue
            try:
                with _device("WSS", wss):
                    self.wss[wss].set_rows({i: [None] * len(r) for i, r in rows.items()})
            except DeviceFailed as e:
                failed.append(e)
        for node in plan.nodes():
            if node in gone.nodes:
                continue
            try:
                with _device("O-NIC", node):
                    self.onics[node].load_routes({})
            except DeviceFailed as e:
                failed.append(e)
        return failed

    def _load(self, plan: Plan, programs: dict[str, Program] | None) -> None:
        for node, routes in plan.routes.items():
            with _device("O-NIC", node):
                self.onics[node].load_routes({d: (r.port, r.channel, r.next_hop)
                                              for d, r in routes.items()})
        for node, prog in (programs or {}).items():
            with _device("O-NIC", node):
                self.onics[node].load_countaction(prog)

    def verify(self, plan: Plan, programs: dict[str, Program] | None = None,
               tables: Mapping[str, list[list[int | None]]] | None = None) -> None:
        """Read back. `tables`: the WSS tables already read, beside other jobs: only the
        plan's own nodes' inputs are compared (the other jobs own the rest)."""
        diffs = []
        for node, prog in (programs or {}).items():
            try:
                back = self.onics[node].read_countaction()
            except CountActionError as e:  # registers that decode to no program at all
                diffs.append(f"O-NIC {node}: count-action read-back is no program: {e}")
                continue
            if back.modules != prog.modules:
                diffs.append(f"O-NIC {node}: count-action program differs on read-back")
        mine = plan.rows(self.grid) if tables is not None else {}
        for t in plan.wss:
            got = tables[t.wss] if tables is not None else self.wss[t.wss].get_table()
            for i, row in enumerate(t.table):
                if tables is not None and i not in mine[t.wss]:
                    continue
                have = got[i][: len(row)] if i < len(got) else []
                if list(have) != list(row):
                    diffs.append(f"WSS {t.wss} input {i}: wrote {row}, read back {have}")
        for node, routes in plan.routes.items():
            want = {d: (r.port, r.channel, r.next_hop) for d, r in routes.items()}
            got_r = self.onics[node].read_routes()
            if got_r != want:
                bad = [d for d in want if got_r.get(d) != want[d]][:3]
                diffs.append(f"O-NIC {node}: routes differ on read-back, e.g. {bad}")
        if diffs:
            raise ApplyError("read-back does not match the plan:\n  " + "\n  ".join(diffs[:20]))
