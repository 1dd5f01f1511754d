"""Where a job goes: which queued jobs fit in the free nodes now (`admissible`), the placers
(rectangles of a grid for several jobs, the whole testbed for one), the schedule a job
runs on its partition, and the partitions of the jobs that start at once (`oddl plan`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.topology import Grid
from oddl.controller.service.health import Health
from oddl.controller.service.jobs import JobRequest
from oddl.controller.service.recovery import replace_ranks
from oddl.controller.stage1.placement import Partition, place
from oddl.controller.stage1.plan import Plan, PlanError
from oddl.controller.stage1.planner import plan_job
from oddl.controller.stage2.job import (
    built_schedule,
)

NEVER = 2**62  # the end (clock ns) of a job with no time limit
WHOLE = "testbed"  # a lone job's partition shape: every live node of the testbed


def admissible(grid: Grid, free: set[str], queue: list[JobRequest], policy: str
               ) -> list[tuple[JobRequest, Partition]]:
    """The queued jobs that start now and where, in policy order. FIFO starts none past
    the first that does not fit (no overtaking); smallest-first tries each, smallest
    first. `free` loses the nodes placed."""
    order = sorted(queue, key=lambda r: (r.ranks, r.arrival_ns, r.name)) \
        if policy == "smallest-first" else list(queue)
    out = []
    for req in order:
        part = place(grid, free, req.name, req.ranks, req.shape, req.exact, req.group)
        if part is None:
            if policy == "fifo":
                break
            continue
        free -= set(part.nodes)
        out.append((req, part))
    return out


# the nodes a job may not hold if it ran until a time (clock ns): maintenance windows, and
# reservations for others than its user or role (the arbiter's; none by default)
Off = Callable[[int, str], frozenset[str]]


@dataclass(frozen=True)
class Running:
    """A running job as backfill sees it: the nodes it holds and when its time limit ends
    (clock ns); it leaves by then at the latest."""

    ends_ns: int
    nodes: frozenset[str]
    job: str = ""


def reservation(grid: Grid, free: set[str], running: list[Running], head: JobRequest,
                maintenance: Off = lambda _end, _job: frozenset()
                ) -> tuple[int, frozenset[str]] | None:
    """When the blocked head of the queue can start at the latest, and on which nodes: the
    running jobs leave at their limits, earliest first, until a rectangle holds it (EASY's
    shadow time), off the nodes of maintenance windows it would run into. None: not even
    then (nodes out of service), so nothing can delay it."""
    avail = set(free)
    for r in sorted(running, key=lambda r: r.ends_ns):
        avail |= r.nodes
        end = r.ends_ns + head.time_limit_ns if head.time_limit_ns else NEVER
        part = place(grid, avail - maintenance(end, head.name), head.name, head.ranks, head.shape,
                     head.exact, head.group)
        if part is not None:
            return r.ends_ns, frozenset(part.nodes)
    return None


# why a queued job did not start in a pass, and when (clock ns) and where it will at the
# latest: its reservation, if it has one
Pending = dict[str, tuple[str, int | None, frozenset[str]]]


def backfill(grid: Grid, free: set[str], queue: list[JobRequest], running: list[Running],
             now_ns: int, may_start: Callable[[JobRequest, list[tuple[JobRequest, Partition]]],
                                              bool] = lambda _r, _p: True,
             pending: Pending | None = None,
             maintenance: Off = lambda _end, _job: frozenset()
             ) -> list[tuple[JobRequest, Partition]]:
    """EASY backfill (as Slurm's and Maui's): the queue's jobs start in order while they
    fit; the first that does not is given a reservation (`reservation`), and each job
    behind it starts now if it fits in the free nodes and cannot delay that start: it ends
    (by its time limit) before it, or it keeps off the reserved nodes. A job that cannot
    start even once every running job has ended (it waits for nodes out of service)
    reserves nothing and blocks nobody; the next that does not fit is given the
    reservation. `may_start` skips
    a job held, or whose user is at a limit (it blocks nobody). `free` loses the nodes
    placed; `pending` gets why each other job waits: "ineligible" (`may_start`),
    "resources" (with its reservation's start), "nodes out of service" (no reservation
    holds it), "reservation" (it would delay the reserved start), "resources" (with no
    start: behind the reserved job, it does not fit in the free nodes), or "maintenance"
    (it fits only on nodes an operator has reserved, for maintenance or for others than
    its user, before it would end: `maintenance(end_ns, job)`, the nodes of the windows
    that begin before `end_ns` and are not the job's; it reserves nothing)."""
    why: Pending = pending if pending is not None else {}
    def ends(req: JobRequest) -> int:  # no limit: it may never end
        return now_ns + req.time_limit_ns if req.time_limit_ns else NEVER

    out: list[tuple[JobRequest, Partition]] = []
    running = list(running)
    blocked: tuple[int, frozenset[str]] | None = None
    for req in queue:
        if not may_start(req, out):
            why[req.name] = ("ineligible", None, frozenset())
            continue
        off = maintenance(ends(req), req.name)
        fits = place(grid, free - off, req.name, req.ranks, req.shape, req.exact, req.group)
        if fits is None and off and place(grid, free, req.name, req.ranks, req.shape,
                                          req.exact, req.group) is not None:
            why[req.name] = ("maintenance", None, frozenset())
            continue
        if blocked is None:  # in order, up to the first that does not fit
            if fits is None:
                # a job no end of the running jobs lets start (it waits for nodes out of
                # service) reserves nothing: the jobs behind go on round it (issue 64)
                blocked = reservation(grid, free, running, req, maintenance)
                why[req.name] = ("resources", *blocked) if blocked else \
                    ("nodes out of service", None, frozenset())
                continue
        elif fits is not None and ends(req) > blocked[0]:
            fits = place(grid, free - off - blocked[1], req.name, req.ranks, req.shape,
                         req.exact, req.group)
            if fits is None:
                why[req.name] = ("reservation", None, frozenset())
                continue
        if fits is None:
            why[req.name] = ("resources", None, frozenset())
            continue
        free -= set(fits.nodes)
        out.append((req, fits))
        running.append(Running(ends(req), frozenset(fits.nodes)))
    return out


class Backfill:
    """The arbiter's placer: rectangles of free nodes in service, by `backfill`, against
    the running jobs and their limits."""

    def __init__(self, grid: Grid,
                 may_start: Callable[[JobRequest, list[tuple[JobRequest, Partition]]], bool],
                 maintenance: Off = lambda _end, _job: frozenset()
                 ) -> None:
        self.grid, self.may_start = grid, may_start
        self.maintenance = maintenance
        self.pending: Pending = {}  # the latest pass's: why each job that did not start

    def place(self, free: set[str], health: Health, queue: list[JobRequest],
              running: list[Running], now_ns: int) -> list[tuple[JobRequest, Partition]]:
        pending: Pending = {}
        out = backfill(self.grid, free - health.out_of_service(), queue, running, now_ns,
                       self.may_start, pending, self.maintenance)
        self.pending = pending
        return out

    def eligible(self, req: JobRequest) -> bool:
        return self.may_start(req, [])


class Placer(Protocol):
    """Where queued jobs start now, if anywhere: (the request as it starts, its nodes),
    beside the jobs that hold nodes now (`running`, and when their limits end). Raises
    RunFailed if a job can never be placed again."""

    def place(self, free: set[str], health: Health, queue: list[JobRequest],
              running: list[Running], now_ns: int) -> list[tuple[JobRequest, Partition]]:
        ...

    def eligible(self, req: JobRequest) -> bool:
        """Whether the queue's rules let `req` start now, nodes aside (a held job, one
        whose user is at a limit: no)."""
        ...


class Rectangles:
    """Several jobs: each on a rectangle of free nodes in service (`admissible`)."""

    def __init__(self, grid: Grid, policy: str) -> None:
        self.grid, self.policy = grid, policy

    def place(self, free: set[str], health: Health, queue: list[JobRequest],
              running: list[Running], now_ns: int) -> list[tuple[JobRequest, Partition]]:
        return admissible(self.grid, free - health.out_of_service(), queue, self.policy)

    def eligible(self, req: JobRequest) -> bool:
        return True


class WholeTestbed:
    """One job: it holds the whole testbed, its ranks the first nodes in grid order and the
    rest its relays. After a fault its dead ranks are replaced per the experiment's
    `recovery` policy (controller/service/recovery.py); dead relays, WSSs and links are planned
    round."""

    def __init__(self, grid: Grid, recovery: str) -> None:
        self.grid, self.recovery = grid, recovery
        self.ranks: list[str] = []

    def place(self, free: set[str], health: Health, queue: list[JobRequest],
              running: list[Running], now_ns: int) -> list[tuple[JobRequest, Partition]]:
        if not queue or len(free) < len(self.grid.nodes):
            return []
        req = queue[0]
        dead = health.avoid().nodes
        if not self.ranks:
            self.ranks = list(self.grid.nodes[: req.ranks])
        ranks, coll = replace_ranks(self.ranks, set(dead), self.grid.nodes, self.recovery,
                                    req.collective)
        self.ranks = ranks
        g = self.grid
        spare = tuple(n for n in g.nodes if n not in ranks and n not in dead)
        return [(replace(req, ranks=len(ranks), collective=coll),
                 Partition(req.name, WHOLE, tuple(range(g.rows)), tuple(range(g.cols)),
                           tuple(ranks), spare))]

    def eligible(self, req: JobRequest) -> bool:
        return True


def schedule_of(req: JobRequest, part: Partition, spec: NetworkSpec) -> Schedule:
    """The job's collective on its partition's rows and columns."""
    return built_schedule(req.collective, req.ranks, req.size, len(part.rows),
                          len(part.cols), spec.degree, spec.bidirectional, req.alltoall,
                          req.hybrid, req.overlap)


def plan_partitions(tb: Any, grid: Grid, requests: list[JobRequest], policy: str,
                    spec: NetworkSpec) -> tuple[list[tuple[Partition, Plan]], list[JobRequest]]:
    """What stage 1 gives the jobs that fit at once, as if all had arrived and none had
    left (`oddl plan --job`): each job's partition and plan, checked isolated from every
    other's; and the jobs that would wait."""
    queue = sorted(requests, key=lambda r: (r.arrival_ns, r.name))
    placed = admissible(grid, set(grid.nodes), queue, policy)
    out: list[tuple[Partition, Plan]] = []
    for req, part in placed:
        plan = plan_job(tb, grid, schedule_of(req, part, spec), req.name, spec.strategy,
                        spec.relay, list(part.ranks), within=frozenset(part.nodes))
        plan.validate(grid)
        clash = [c for _p, other in out for c in plan.conflicts(other, grid)]
        if clash:
            raise PlanError("; ".join(clash[:5]))
        out.append((part, plan))
    started = {r.name for r, _ in placed}
    return out, [r for r in queue if r.name not in started]
