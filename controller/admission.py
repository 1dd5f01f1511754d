"""Several jobs on one fabric: arrivals, a queue, placement, stage 1 per job, departures.

The arbiter as a long-lived service (docs/multijob.md): a job arrives at its time, waits
in the queue until a partition of free nodes holds it (FIFO, or smallest first), is placed
(controller/placement.py), gets its own stage 1 beside the running jobs (ODDL: its WSS
entries, routes and count-action programs only, read back with everyone else's), runs its
iterations, and gives its nodes back when it leaves. Every job runs on the back end's one
clock at once, so jobs that share a network's links (the baselines) slow each other down
exactly as much as the flow model says; ODDL's isolated partitions do not.

A fault stops only the jobs it concerns (`Health.touches`). Such a job gives its partition
back once the watch has settled and its light has landed, and waits at the head of the
queue to go on from its first iteration not recorded, on live nodes only.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from oddl.controller.arbiter import Arbiter
from oddl.controller.backend import Backend, Iteration, JobOutcome, JobStopped, RunFailed
from oddl.controller.clock import Clock
from oddl.controller.collectives import Schedule
from oddl.controller.compat import Arrival, Profile, shift_against
from oddl.controller.config import JobEntry, NetworkSpec
from oddl.controller.health import Diagnosis, Watch
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
from oddl.controller.planner import NO_FAULTS, Avoid, plan_job
from oddl.controller.recovery import Recovery
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


MAX_STOPS = 3  # a job stopped for faults more often than this fails the run


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
    placed_ns: int = 0  # when its partition was last given it
    held_ns: int = 0  # node-ns held on partitions it has left (stopped for a fault)
    # each stop for a fault: when, why, where it ran, the iteration it went on from
    stops: list[dict[str, Any]] = field(default_factory=list)

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
            | ({"cassini": asdict(self.cassini)} if self.cassini else {}) \
            | ({"stops": self.stops} if self.stops else {})

    def node_ns(self) -> int:
        """Node-ns it held its partitions for."""
        p = self.partition
        return self.held_ns + (len(p.nodes) * ((self.end_ns or 0) - self.placed_ns)
                               if p is not None else 0)


def percentile(xs: list[int] | list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]


class Stage1(Protocol):
    """What a network does when a job is placed and when it leaves (ODDL: plan, apply
    and read back its partition; a baseline: nothing to configure)."""

    def admit(self, req: JobRequest, part: Partition, schedule: Schedule
              ) -> tuple[dict[str, dict[str, tuple[str, int, str]]], bool]: ...
    def release(self, job: str, gone: Avoid = NO_FAULTS) -> None: ...
    def tables(self) -> dict[str, list[list[int | None]]]: ...


class NoStage1:
    def admit(self, req: JobRequest, part: Partition, schedule: Schedule
              ) -> tuple[dict[str, dict[str, tuple[str, int, str]]], bool]:
        return {}, False

    def release(self, job: str, gone: Avoid = NO_FAULTS) -> None:
        pass

    def tables(self) -> dict[str, list[list[int | None]]]:
        return {}


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

    def release(self, job: str, gone: Avoid = NO_FAULTS) -> None:
        self.arbiter.release(job, gone)

    def tables(self) -> dict[str, list[list[int | None]]]:
        return self.arbiter.tables()


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
        self.running = 0
        self.resume: dict[str, int] = {}  # a stopped job's first iteration not recorded
        self.recoveries: list[Recovery] = []  # each stopped job's, once it goes on
        self.outcomes: list[JobOutcome] = []  # every attempt's, stopped ones too
        self._stopped: dict[str, tuple[int, int, JobStopped, list[Diagnosis]]] = {}
        self._last: dict[str, int] = {}  # when each job's latest iteration was recorded
        self.watch: Watch | None = None
        self.clock = Clock(backend.loop)
        self.t0 = 0
        self.left = len(requests)
        self._done: asyncio.Future[None] | None = None
        self._stuck_ns: int | None = None  # since when nothing runs and nothing fits
        self._recheck: asyncio.TimerHandle | None = None  # the next look at the queue

    def run(self) -> dict[str, JobRecord]:
        loop = self.b.loop
        self._done = loop.create_future()
        self.t0 = self.clock.now_ns()
        for req in self.requests:
            self.clock.call_at_ns(self.t0 + req.arrival_ns, self._arrive, req)
        if not self.requests:
            self._done.set_result(None)
        if self.b.health is not None:  # the WSSs polled for the tables written, beats judged
            self.watch = Watch(self.clock, self.b.health, self.b.wss).start()
        try:
            loop.run_until_complete(self._done)
        finally:
            if self.watch is not None:
                self.watch.stop()
            if self._recheck is not None:
                self._recheck.cancel()
        return self.records

    def _arrive(self, req: JobRequest) -> None:
        self.queue.append(req)
        self._admit()

    def _admit(self) -> None:
        """Start every queued job that fits now (`admissible`) on nodes in service. While
        nodes are out of service, look again every heartbeat period: one that comes back
        (a board that beats again) may be what the head of the queue waits for."""
        health = self.b.health
        down = health.out_of_service() if health is not None else set()
        for req, part in admissible(self.grid, self.free - down, self.queue, self.policy):
            self.queue.remove(req)
            self.free -= set(part.nodes)
            try:
                self._start(req, part)
            except Exception as e:  # a job that cannot start fails the run, saying which
                self._fail(RunFailed(f"{self.spec.name}: job {req.name} on "
                                     f"{part.describe()}: {e}"))
                return
        now = self.clock.now_ns()
        if not self.queue or self.running:
            self._stuck_ns = None
        elif self._stuck_ns is None:  # every node free, and still none fits
            self._stuck_ns = now
        grace_ns = self.tb.monitor.grace_ms * 1e6
        if self._stuck_ns is not None and (not down or now - self._stuck_ns >= grace_ns):
            req = self.queue[0]
            shape = "" if req.shape == "any" else f"{req.shape} "
            self._fail(RunFailed(
                f"{self.spec.name}: job {req.name}: no {shape}rectangle of the nodes in "
                f"service holds {req.ranks} ranks; out of service: {', '.join(sorted(down))}"
                f" (waited {(now - self._stuck_ns) / 1e6:.0f} ms for them, grace_ms)"))
        elif self.queue and down and self._recheck is None:
            assert health is not None
            self._recheck = self.clock.call_later_ns(health.period_ns, self._look_again)

    def _look_again(self) -> None:
        self._recheck = None
        if self._done is not None and not self._done.done():
            self._admit()

    def _start(self, req: JobRequest, part: Partition) -> None:
        rec = self.records[req.name]
        now = self.clock.now_ns()
        rec.partition, rec.placed_ns = part, now - self.t0
        if rec.start_ns is None:
            rec.start_ns = rec.placed_ns
        if req.name in self._stopped:  # it goes on, after a fault
            t_stop, t_last, stop, found = self._stopped.pop(req.name)
            self.recoveries.append(Recovery(t_stop, now, t_last, found, stop.lost,
                                            stop.flows_lost, True))
            rec.stops[-1]["resumed_on"] = part.describe()
        self.running += 1
        schedule = schedule_of(req, part, self.spec)
        routes, nic_sync = self.stage1.admit(req, part, schedule)
        self._watch_tables()
        shift_ns = self._shift(req, part, schedule, rec)
        attempt = f"r{len(rec.stops)}" if rec.stops else ""  # a stopped id is not reused
        spec = JobSpec(JOB_VERSION, job_id(self.run_name, self.spec.name, req.name, attempt),
                       req.collective, req.size, len(part.rows), len(part.cols),
                       self.spec.degree, self.spec.bidirectional, list(part.ranks),
                       list(part.nodes), req.iterations, req.compute_ns, nic_sync,
                       timing_of(self.tb), routes, start=self.resume.get(req.name, 0),
                       tag=self.tags[req.name], alltoall=req.alltoall, weight=req.weight)

        def on_iteration(it: Iteration) -> None:
            rec.iteration_ns.append(it.t_end - it.t_start)
            self._last[req.name] = self.clock.now_ns()
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
        rec = self.records[req.name]
        self._profiles.pop(req.name, None)
        self._began.pop(req.name, None)
        exc = task.exception()
        if isinstance(exc, JobStopped) and len(rec.stops) < MAX_STOPS:
            # it holds its partition (and counts as running) until `_stop` gives it back
            stopping = self.b.loop.create_task(self._stop(req, part, exc))
            stopping.add_done_callback(self._failed)
            return
        self.running -= 1
        if isinstance(exc, JobStopped):
            exc = RunFailed(f"{self.spec.name}: job {req.name}: stopped for faults "
                            f"{len(rec.stops) + 1} times; the last: {exc}")
        if exc is not None:
            self._fail(exc)
            return
        out = task.result()
        self.outcomes.append(out)
        rec.end_ns, rec.flows = self.clock.now_ns() - self.t0, rec.flows + out.flows
        try:
            self.stage1.release(req.name)
        except Exception as e:  # in a done callback: raised, it would only be logged
            self._fail(RunFailed(f"{self.spec.name}: job {req.name} left: {e}"))
            return
        self._watch_tables()
        self.free |= set(part.nodes)
        self.left -= 1
        if self.left == 0 and self._done is not None and not self._done.done():
            self._done.set_result(None)
        else:
            self._admit()

    async def _stop(self, req: JobRequest, part: Partition, stop: JobStopped) -> None:
        """A job stopped for a fault on its partition: once the watch has settled, the bus
        is back and the job's light has landed (`grace_ms` at most), the partition goes
        back to the pool and the job to the head of the queue."""
        health, now = self.b.health, self.clock.now_ns()
        assert health is not None  # only a watched back end stops a job
        rec = self.records[req.name]
        self.outcomes.append(stop.outcome)
        rec.flows += stop.outcome.flows
        rec.held_ns += len(part.nodes) * (now - self.t0 - rec.placed_ns)
        waited_ns = 0
        while waited_ns < self.tb.monitor.grace_ms * 1e6:
            # judged first: a board not yet found dead would be asked if it is dark
            if health.settled() and health.bus_down_since is None and not any(
                    self.b.onics[n].transmitting() for n in part.nodes
                    if not health.is_dead(n)):
                break
            await asyncio.sleep(health.period_ns / 1e9)
            waited_ns += health.period_ns
        self.stage1.release(req.name, health.avoid())
        self._watch_tables()
        self.free |= set(part.nodes)
        self._stopped[req.name] = (now, self._last.get(req.name, now), stop,
                                   health.pending(part.nodes))
        self.resume[req.name] = stop.next_iteration
        rec.stops.append({"at_s": round((now - self.t0) / 1e9, 9), "why": str(stop),
                          "ran_on": part.describe(), "from_iteration": stop.next_iteration})
        self.running -= 1
        self.queue.insert(0, req)
        self._admit()

    def _watch_tables(self) -> None:
        if self.watch is not None:
            self.watch.expected = self.stage1.tables()

    def _failed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

    def _fail(self, e: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(e)
