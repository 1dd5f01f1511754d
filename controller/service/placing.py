"""Where a job goes: which queued jobs fit in the free nodes now (`admissible`), the placers
(rectangles of a grid for several jobs, the whole testbed for one), the schedule a job
runs on its partition, and the partitions of the jobs that start at once (`oddl plan`)."""

from __future__ import annotations

from dataclasses import replace
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


class Placer(Protocol):
    """Where queued jobs start now, if anywhere: (the request as it starts, its nodes).
    Raises RunFailed if a job can never be placed again."""

    def place(self, free: set[str], health: Health, queue: list[JobRequest]
              ) -> list[tuple[JobRequest, Partition]]: ...


class Rectangles:
    """Several jobs: each on a rectangle of free nodes in service (`admissible`)."""

    def __init__(self, grid: Grid, policy: str) -> None:
        self.grid, self.policy = grid, policy

    def place(self, free: set[str], health: Health, queue: list[JobRequest]
              ) -> list[tuple[JobRequest, Partition]]:
        return admissible(self.grid, free - health.out_of_service(), queue, self.policy)


class WholeTestbed:
    """One job: it holds the whole testbed, its ranks the first nodes in grid order and the
    rest its relays. After a fault its dead ranks are replaced per the experiment's
    `recovery` policy (controller/service/recovery.py); dead relays, WSSs and links are planned
    round."""

    def __init__(self, grid: Grid, recovery: str) -> None:
        self.grid, self.recovery = grid, recovery
        self.ranks: list[str] = []

    def place(self, free: set[str], health: Health, queue: list[JobRequest]
              ) -> list[tuple[JobRequest, Partition]]:
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


def schedule_of(req: JobRequest, part: Partition, spec: NetworkSpec) -> Schedule:
    """The job's collective on its partition's rows and columns."""
    return built_schedule(req.collective, req.ranks, req.size, len(part.rows),
                          len(part.cols), spec.degree, spec.bidirectional, req.alltoall,
                          req.hybrid)


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
