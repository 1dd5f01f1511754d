"""Stage 1, the central arbiter: inventory, plan, apply, read back, and only then go.

It talks to devices only through `controller.base.devices` interfaces and never sits in the
per-flow path.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import Testbed
from oddl.controller.base.devices import DeviceRefused, ONic, WSSDevice
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.plan import Plan
from oddl.controller.stage1.planner import NO_FAULTS, Avoid, plan_job
from oddl.fpga.countaction import CountActionError, Program

T = TypeVar("T")


class FanOut(Protocol):
    """Runs one call per device; their results in order, the first failure raised once
    every call has ended."""

    def __call__(self, calls: Sequence[Callable[[], T]]) -> list[T]: ...


def one_by_one(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Device calls in order, on this thread (a back end of models: its devices share a
    clock and a loop, and must be driven in one order)."""
    return [c() for c in calls]


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


def _call(what: str, target: str, fn: Callable[..., T], *args: Any) -> Callable[[], T]:
    """One device's call, its failure a DeviceFailed naming it."""
    def call() -> T:
        with _device(what, target):
            return fn(*args)
    return call


def _failure(what: str, target: str, fn: Callable[..., object], *args: Any
             ) -> Callable[[], DeviceFailed | None]:
    """One device's call whose failure is returned, not raised (a release goes on)."""
    def call() -> DeviceFailed | None:
        try:
            _call(what, target, fn, *args)()
        except DeviceFailed as e:
            return e
        return None
    return call


class Arbiter:
    def __init__(self, tb: Testbed, grid: Grid, onics: Mapping[str, ONic],
                 wss: Mapping[str, WSSDevice], fan_out: FanOut = one_by_one) -> None:
        """`fan_out` runs one call per device and returns their results in order, raising
        the first failure once all have ended: the back end's (devices of a lab, each on
        its own connection, at once; models, one by one)."""
        self.tb = tb
        self.grid = grid
        self.onics = onics
        self.wss = wss
        self.fan_out = fan_out
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
        self.fan_out([_call("WSS", t.wss, self.wss[t.wss].set_table, t.table)
                      for t in plan.wss])
        self._load(plan, programs)
        self.verify(plan, programs)

    def admit(self, plan: Plan, programs: dict[str, Program] | None = None,
              gone: Avoid = NO_FAULTS) -> None:
        """One job beside the running ones (ODDL stage 1 with several jobs): refused if it
        would share a node or a (WSS port, wavelength) with any of them; only its own WSS
        inputs, routes and programs are written, the others' light is not touched; then
        every running job's entries are read back too, unchanged (on the devices not known
        to be `gone`). All or nothing: if any of it fails, what it wrote is cleared again
        and the job is not live."""
        job = plan.jobs[0].job
        plan.validate(self.grid)
        clash = [c for other in self.live.values() for c in plan.conflicts(other, self.grid)]
        if job in self.live or clash:
            raise ApplyError(f"job {job} is not isolated: " + (
                "; ".join(clash[:5]) if clash else "a job of that name is running"))
        self.live[job] = plan
        try:
            self.fan_out([_call("WSS", wss, self.wss[wss].set_rows, rows)
                          for wss, rows in plan.rows(self.grid).items()])
            self._load(plan, programs)
            used = sorted({t.wss for p in self.live.values() for t in p.wss} - gone.wss)
            read = self.fan_out([_call("WSS", w, self.wss[w].get_table) for w in used])
            tables = dict(zip(used, read, strict=True))  # each WSS read once, for every job
            for p in self.live.values():
                self.verify(p, programs if p is plan else None, tables,
                            NO_FAULTS if p is plan else gone)
        except BaseException:
            self.release(job, gone)  # what does not answer holds no light of it either
            raise

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
        calls = [_failure("WSS", wss, self.wss[wss].set_rows,
                          {i: [None] * len(r) for i, r in rows.items()})
                 for wss, rows in plan.rows(self.grid).items() if wss not in gone.wss]
        calls += [_failure("O-NIC", node, self.onics[node].load_routes, {})
                  for node in plan.nodes() if node not in gone.nodes]
        return [e for e in self.fan_out(calls) if e is not None]

    def _load(self, plan: Plan, programs: dict[str, Program] | None) -> None:
        """Every node's routes, then every node's count-action program."""
        self.fan_out([_call("O-NIC", node, self.onics[node].load_routes,
                            {d: (r.port, r.channel, r.next_hop) for d, r in routes.items()})
                      for node, routes in plan.routes.items()])
        self.fan_out([_call("O-NIC", node, self.onics[node].load_countaction, prog)
                      for node, prog in (programs or {}).items()])

    def verify(self, plan: Plan, programs: dict[str, Program] | None = None,
               tables: Mapping[str, list[list[int | None]]] | None = None,
               gone: Avoid = NO_FAULTS) -> None:
        """Read back. `tables`: the WSS tables already read, beside other jobs: only the
        plan's own nodes' inputs are compared (the other jobs own the rest). `gone`: the
        devices not asked (a running job's, found dead: its own stop is the watch's)."""
        def program_back(node: str) -> Program | str:
            try:
                return _call("O-NIC", node, self.onics[node].read_countaction)()
            except CountActionError as e:  # registers that decode to no program at all
                return f"O-NIC {node}: count-action read-back is no program: {e}"

        # read in the order written: the programs, the WSSs, the routes; each a fan-out
        progs = dict(zip(programs or {}, self.fan_out(
            [functools.partial(program_back, n) for n in programs or {}]), strict=True))
        if tables is None:
            ws = [t.wss for t in plan.wss]
            tables = dict(zip(ws, self.fan_out([_call("WSS", w, self.wss[w].get_table)
                                                for w in ws]), strict=True))
            mine = None
        else:
            mine = plan.rows(self.grid)
        asked = [n for n in plan.routes if n not in gone.nodes]
        routes_back = dict(zip(asked, self.fan_out(
            [_call("O-NIC", n, self.onics[n].read_routes) for n in asked]), strict=True))
        diffs = []
        for node, prog in (programs or {}).items():
            back = progs[node]
            if isinstance(back, str):
                diffs.append(back)
            elif back.modules != prog.modules:
                diffs.append(f"O-NIC {node}: count-action program differs on read-back")
        for t in plan.wss:
            if t.wss in gone.wss:
                continue
            got = tables[t.wss]
            for i, row in enumerate(t.table):
                if mine is not None and i not in mine[t.wss]:
                    continue
                have = got[i][: len(row)] if i < len(got) else []
                if list(have) != list(row):
                    diffs.append(f"WSS {t.wss} input {i}: wrote {row}, read back {have}")
        for node, routes in plan.routes.items():
            if node in gone.nodes:
                continue
            want = {d: (r.port, r.channel, r.next_hop) for d, r in routes.items()}
            got_r = routes_back[node]
            if got_r != want:
                bad = [d for d in want if got_r.get(d) != want[d]][:3]
                diffs.append(f"O-NIC {node}: routes differ on read-back, e.g. {bad}")
        if diffs:
            raise ApplyError("read-back does not match the plan:\n  " + "\n  ".join(diffs[:20]))
