"""Several jobs on one fabric: arrivals, a queue, placement, stage 1 per job, departures.

The arbiter as a long-lived service (docs/multijob.md): a job arrives at its time, waits
in the queue until a partition of free nodes holds it (FIFO, or smallest first), is placed
(controller/placement.py), gets its own stage 1 beside the running jobs (ODDL: its WSS
entries, routes and count-action programs only, read back with everyone else's), runs its
iterations, and gives its nodes back when it leaves. Every job runs on the back end's one
clock at once, so jobs that share a network's links (the baselines) slow each other down
exactly as much as the flow model says; ODDL's isolated partitions do not.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from oddl.controller.arbiter import Arbiter
from oddl.controller.backend import Backend, Iteration, RunFailed
from oddl.controller.clock import Clock
from oddl.controller.collectives import Schedule
from oddl.controller.compat import Arrival, Profile, shift_against
from oddl.controller.config import JobEntry, NetworkSpec
from oddl.controller.invariants import MAX_TAG
from oddl.controller.job import (
    JOB_VERSION,
    JobSpec,
    built_schedule,
    job_id,
    nic_programs,
    timing_of,
    wire_routes,
)
from oddl.controller.placement import Partition, place
from oddl.controller.plan import Plan, PlanError
from oddl.controller.planner import plan_job
from oddl.controller.topology import Grid
from oddl.controller.workloads import alltoall_bytes, compute_ms, model_spec


@dataclass(frozen=True)
class JobRequest:
    """A job as the queue holds it: what it needs, and for how long."""

    name: str
    model: str
    collective: str
    ranks: int
    iterations: int
    compute_ns: int
    arrival_ns: int
    shape: str
    size: int  # gradient bytes
    alltoall: int = 0  # bytes per rank pair per iteration (DLRM's embedding exchange)
    weight: float = 1.0  # its share of a link shared by weight
    shift_ns: int = 0  # its first iteration starts this long after it starts (CASSINI)

    @classmethod
    def of(cls, e: JobEntry) -> JobRequest:
        ms = e.compute_time_ms if e.compute_time_ms is not None else \
            compute_ms(e.model, e.batch_per_node)
        return cls(e.name, e.model, e.collective, e.ranks, e.total_iterations(),
                   round(ms * 1e6), round(e.arrival_ms * 1e6), e.shape,
                   model_spec(e.model).grad_bytes(e.bytes_per_param),
                   alltoall_bytes(e.model, e.batch_per_node, e.ranks), e.weight,
                   round(e.shift_ms * 1e6))

    @property
    def exact(self) -> bool:
        """2-D hierarchical needs its whole rectangle (no spare cells)."""
        return self.collective == "hier2d"


@dataclass
class JobRecord:
    """One job's life on one network."""

    name: str
    arrival_ns: int
    partition: Partition | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    iteration_ns: list[int] = field(default_factory=list)
    flows: int = 0
    # CASSINI (a network with `cassini`): the start delay chosen against the jobs running
    # at its start, and the worst shared link's score with it and without
    cassini: Arrival | None = None

    @property
    def jct_s(self) -> float:
        assert self.end_ns is not None
        return (self.end_ns - self.arrival_ns) / 1e9

    @property
    def queued_s(self) -> float:
        assert self.start_ns is not None
        return (self.start_ns - self.arrival_ns) / 1e9

    def public(self) -> dict[str, Any]:
        its = sorted(self.iteration_ns)
        p = self.partition
        return {"jct_s": round(self.jct_s, 9), "queued_s": round(self.queued_s, 9),
                "iterations": len(its),
                "iteration_time_s": round(sum(its) / len(its) / 1e9, 9) if its else None,
                "iteration_p99_s": round(percentile(its, 99) / 1e9, 9) if its else None,
                "nodes": len(p.nodes) if p else 0, "shape": p.shape if p else None} \
            | ({"cassini": asdict(self.cassini)} if self.cassini else {})


def percentile(xs: list[int] | list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]


class Stage1(Protocol):
    """What a network does when a job is placed and when it leaves (ODDL: plan, apply
    and read back its partition; a baseline: nothing to configure)."""

    def admit(self, req: JobRequest, part: Partition, schedule: Schedule
              ) -> tuple[dict[str, dict[str, tuple[str, int, str]]], bool]: ...
    def release(self, job: str) -> None: ...


class NoStage1:
    def admit(self, req: JobRequest, part: Partition, schedule: Schedule
              ) -> tuple[dict[str, dict[str, tuple[str, int, str]]], bool]:
        return {}, False

    def release(self, job: str) -> None:
        pass


class OddlStage1:
    """The arbiter per job: plan within the partition, admit beside the running jobs."""

    def __init__(self, arbiter: Arbiter, spec: NetworkSpec) -> None:
        self.arbiter, self.spec = arbiter, spec
        self.plan_s = 0.0

    def admit(self, req: JobRequest, part: Partition, schedule: Schedule
              ) -> tuple[dict[str, dict[str, tuple[str, int, str]]], bool]:
        t = time.perf_counter()
        plan = self.arbiter.plan(schedule, self.spec.strategy, job=req.name,
                                 relay=self.spec.relay, ranks=list(part.ranks),
                                 within=frozenset(part.nodes))
        self.plan_s += time.perf_counter() - t
        programs = nic_programs(schedule, part.ranks)
        self.arbiter.admit(plan, programs)
        return wire_routes(plan), programs is not None

    def release(self, job: str) -> None:
        self.arbiter.release(job)


def admissible(grid: Grid, free: set[str], queue: list[JobRequest], policy: str
               ) -> list[tuple[JobRequest, Partition]]:
    """The queued jobs that start now and where, in policy order. FIFO starts none past
    the first that does not fit (no overtaking); smallest-first tries each, smallest
    first. `free` loses the nodes placed."""
    order = sorted(queue, key=lambda r: (r.ranks, r.arrival_ns, r.name)) \
        if policy == "smallest-first" else list(queue)
    out = []
    for req in order:
        part = place(grid, free, req.name, req.ranks, req.shape, req.exact)
        if part is None:
            if policy == "fifo":
                break
            continue
        free -= set(part.nodes)
        out.append((req, part))
    return out


def schedule_of(req: JobRequest, part: Partition, spec: NetworkSpec) -> Schedule:
    """The job's collective on its partition's rows and columns."""
    return built_schedule(req.collective, req.ranks, req.size, len(part.rows),
                          len(part.cols), spec.degree, spec.bidirectional, req.alltoall)


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


OnJob = Callable[[JobRecord, Iteration], None]  # a job's iteration, as it completes
# a job's demand on each link it uses, measured alone (sim/profile.py): name, ranks'
# nodes, schedule, compute per iteration (ns)
Profiler = Callable[[str, Sequence[str], Schedule, int], dict[object, Profile]]


class Admission:
    """Runs a trace of jobs on one network's back end, every job on the one clock."""

    def __init__(self, backend: Backend, grid: Grid, requests: list[JobRequest],
                 policy: str, stage1: Stage1, spec: NetworkSpec, testbed: Any,
                 run_name: str, on_iteration: OnJob | None = None,
                 profiler: Profiler | None = None) -> None:
        if len(requests) > MAX_TAG:
            raise RunFailed(f"{len(requests)} jobs: at most {MAX_TAG} in one run")
        self.b, self.grid, self.policy, self.stage1 = backend, grid, policy, stage1
        self.spec, self.tb, self.run_name = spec, testbed, run_name
        self.requests = sorted(requests, key=lambda r: (r.arrival_ns, r.name))
        self.records = {r.name: JobRecord(r.name, r.arrival_ns) for r in requests}
        self.tags = {r.name: k for k, r in enumerate(self.requests, start=1)}  # flow ids
        self.on_iteration = on_iteration
        self.profiler = profiler  # CASSINI's start delays, against the running jobs
        self._profiles: dict[str, dict[object, Profile]] = {}  # the running jobs'
        self._began: dict[str, int] = {}  # when each running job's latest iteration began
        self.free = set(grid.nodes)
        self.queue: list[JobRequest] = []
        self.clock = Clock(backend.loop)
        self.t0 = 0
        self.left = len(requests)
        self._done: asyncio.Future[None] | None = None

    def run(self) -> dict[str, JobRecord]:
        loop = self.b.loop
        self._done = loop.create_future()
        self.t0 = self.clock.now_ns()
        for req in self.requests:
            self.clock.call_at_ns(self.t0 + req.arrival_ns, self._arrive, req)
        if not self.requests:
            self._done.set_result(None)
        loop.run_until_complete(self._done)
        return self.records

    def _arrive(self, req: JobRequest) -> None:
        self.queue.append(req)
        self._admit()

    def _admit(self) -> None:
        """Start every queued job that fits now (`admissible`)."""
        for req, part in admissible(self.grid, self.free, self.queue, self.policy):
            self.queue.remove(req)
            try:
                self._start(req, part)
            except Exception as e:  # a job that cannot start fails the run, saying which
                self._fail(RunFailed(f"{self.spec.name}: job {req.name} on "
                                     f"{part.describe()}: {e}"))
                return

    def _start(self, req: JobRequest, part: Partition) -> None:
        rec = self.records[req.name]
        rec.partition, rec.start_ns = part, self.clock.now_ns() - self.t0
        schedule = schedule_of(req, part, self.spec)
        routes, nic_sync = self.stage1.admit(req, part, schedule)
        shift_ns = self._shift(req, part, schedule, rec)
        spec = JobSpec(JOB_VERSION, job_id(self.run_name, self.spec.name, req.name),
                       req.collective, req.size, len(part.rows), len(part.cols),
                       self.spec.degree, self.spec.bidirectional, list(part.ranks),
                       list(part.nodes), req.iterations, req.compute_ns, nic_sync,
                       timing_of(self.tb), routes, tag=self.tags[req.name],
                       alltoall=req.alltoall, weight=req.weight)

        def on_iteration(it: Iteration) -> None:
            rec.iteration_ns.append(it.t_end - it.t_start)
            if req.name in self._began:
                self._began[req.name] = it.t_end  # the next one begins as this one ends
            if self.on_iteration is not None:
                self.on_iteration(rec, it)

        task = self.b.loop.create_task(self._run(spec, on_iteration, shift_ns))
        task.add_done_callback(lambda t: self._finish(req, part, t))

    def _shift(self, req: JobRequest, part: Partition, schedule: Schedule,
               rec: JobRecord) -> int:
        """The job's start delay (ns): its own `shift_ms`; or, with a profiler, CASSINI's
        against the jobs running now, each at its phase (controller/compat.py)."""
        if self.profiler is None:
            return req.shift_ns
        mine = self.profiler(req.name, part.ranks, schedule, req.compute_ns)
        now = self.clock.now_ns()
        running: dict[object, list[tuple[Profile, float]]] = {}
        for job, links in self._profiles.items():
            phase_ms = (now - self._began[job]) / 1e6
            for link, p in links.items():
                running.setdefault(link, []).append((p, phase_ms))
        rec.cassini = shift_against(mine, running)
        shift_ns = round(rec.cassini.shift_ms * 1e6)
        self._profiles[req.name], self._began[req.name] = mine, now + shift_ns
        return shift_ns

    async def _run(self, spec: JobSpec, on_iteration: Callable[[Iteration], None],
                   shift_ns: int) -> Any:
        """A time shift (CASSINI): the job holds its nodes, and its first iteration starts
        `shift_ns` late, so that its communication interleaves with its neighbours'."""
        if shift_ns:
            await asyncio.sleep(shift_ns / 1e9)  # the back end's clock (virtual in sim)
        return await self.b.run_job(spec, on_iteration, False)

    def _finish(self, req: JobRequest, part: Partition, task: asyncio.Task[Any]) -> None:
        if task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]
            return
        out = task.result()
        rec = self.records[req.name]
        rec.end_ns, rec.flows = self.clock.now_ns() - self.t0, out.flows
        self._profiles.pop(req.name, None)
        self._began.pop(req.name, None)
        self.stage1.release(req.name)
        self.free |= set(part.nodes)
        self.left -= 1
        if self.left == 0 and self._done is not None and not self._done.done():
            self._done.set_result(None)
        else:
            self._admit()

    def _fail(self, e: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(e)
