"""Jobs on one network: arrivals, a queue, placement, stage 1 per job, the watch, stops for
faults, departures. The one orchestration of every run.

An experiment of one workload is a one-job admission: its job holds the whole testbed
(`WholeTestbed`), its ranks the first nodes in grid order. An experiment of several jobs
(docs/multijob.md) places each on a rectangle of free nodes (`Rectangles`): it arrives at
its time, waits in the queue until a partition holds it (FIFO, or smallest first), gets
its own stage 1 beside the running jobs (ODDL: its WSS entries, routes and count-action
programs only, read back with everyone else's), runs its iterations, and gives its nodes
back when it leaves. Every job runs on the back end's one clock at once, so jobs that
share a network's links (the baselines) slow each other down exactly as much as the flow
model says; ODDL's isolated partitions do not.

A fault stops only the jobs it concerns (`StopRule`, applied by every back end). Such a job
waits until the watch has settled, the bus is back and its light has landed (`grace_ms` at
most), gives its partition back, and goes on from its first iteration not recorded: at the
head of the queue, on nodes in service (several jobs), or on the whole testbed with its
dead ranks replaced per the experiment's `recovery` policy and everything else that failed
planned round (one job). A job is stopped at most `MAX_STOPS` times.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal, Protocol

from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.faultkinds import DIAGNOSES
from oddl.controller.base.telemetry import plan_note
from oddl.controller.base.topology import Grid
from oddl.controller.service.alignment import Alignment, Profiler
from oddl.controller.service.backend import (
    Backend,
    Iteration,
    JobOutcome,
    JobStopped,
    RunFailed,
    Stalled,
    StopRule,
)
from oddl.controller.service.deadlines import Deadlines
from oddl.controller.service.health import landed
from oddl.controller.service.jobs import JobRecord, JobRequest
from oddl.controller.service.jobtable import JobTable, Stopped
from oddl.controller.service.placing import (
    NEVER,
    WHOLE,
    Placer,
    Running,
    schedule_of,
)
from oddl.controller.service.recovery import Recovery
from oddl.controller.service.stage1_io import Stage1Io
from oddl.controller.service.stages import Routes, Stage1
from oddl.controller.service.watchers import Watchers
from oddl.controller.stage1.arbiter import DeviceFailed
from oddl.controller.stage1.placement import Partition
from oddl.controller.stage1.plan import Plan, PlanError
from oddl.controller.stage2.invariants import MAX_TAG
from oddl.controller.stage2.job import (
    JOB_VERSION,
    JobSpec,
    job_id,
    timing_of,
)
from oddl.controller.stage2.trace import Timeline

MAX_STOPS = 3  # a job stopped for faults more often than this fails the run
STOPPED_TOO_OFTEN = "stopped for faults"  # how that failure begins (the service holds it)
CARRY_WAIT_S = 2.0  # how long a stopped job's ranks may take to say what they delivered

OnJob = Callable[[JobRecord, Iteration], None]  # a job's iteration, as it completes


class JobService(Protocol):
    """The service's side of an orchestration it runs (app/queue.py): with one, a job that
    cannot go on ends alone, and the service is told what each job holds and how it ended."""

    def on_end(self, rec: JobRecord, state: str, why: str) -> None:
        """A job has ended: its record, "finished" | "failed" | "cancelled" | "timeout",
        and why."""

    def on_hold(self, job: str, nodes: int) -> None:
        """A job now holds this many nodes (0: it has given them back)."""

    def rank(self, req: JobRequest) -> float:
        """A queued job's priority now (fair share, age): higher starts first."""


class Admission:
    """Runs the jobs of one network on its back end, every job on the one clock: a run's
    (`run`: the jobs given, a job that cannot go on fails the run) or the service's
    (`open`, then `submit` and `cancel` as people ask; a job that cannot go on ends alone,
    told to the `service`)."""

    def __init__(self, backend: Backend, grid: Grid, requests: list[JobRequest],
                 placer: Placer, stage1: Stage1, spec: NetworkSpec, testbed: Any,
                 run_name: str, experiment: str, on_iteration: OnJob | None = None,
                 profiler: Profiler | None = None, trace: Timeline | None = None,
                 record_flows: bool = False, service: JobService | None = None,
                 extend: bool = False) -> None:
        """extend: a job that nothing but its own iterations can reach may have its
        repeated iteration's copies written rather than simulated (sim/steady.py)."""
        if len(requests) > MAX_TAG:
            raise RunFailed(f"{len(requests)} jobs: at most {MAX_TAG} in one run")
        self.b, self.grid, self.placer, self.stage1 = backend, grid, placer, stage1
        # run_name: unique to this run (job ids are never reused: a node program refuses
        # a job stopped before); experiment: as the watchers are told
        self.spec, self.tb, self.run_name, self.experiment = spec, testbed, run_name, experiment
        self.health = backend.health
        self.requests = sorted(requests, key=lambda r: (r.arrival_ns, r.name))
        self.jobs = JobTable(requests)
        self.records = self.jobs.records
        self.on_iteration = on_iteration
        self.trace, self.record_flows, self.service = trace, record_flows, service
        # nothing else can reach a run's one job: no other, no operator, no time limit,
        # no trace, no CASSINI pauses
        self.extend = extend and service is None and len(requests) == 1 and \
            trace is None and not spec.cassini and not requests[0].time_limit_ns
        self.free = set(grid.nodes)
        # nodes out by the service's word: drained by an operator, or kept out after a
        # device would not clear them (node -> why)
        self.closed: dict[str, str] = {}
        self._admitting = False  # `_admit` under way (a job it ends asks again: `_again`)
        self._again = False
        self.queue: list[JobRequest] = []
        self.running = 0
        self.recoveries: list[Recovery] = []  # each stopped job's, once it goes on
        self.outcomes: list[JobOutcome] = []  # every attempt's, stopped ones too
        self.told = Watchers(backend, spec.name, run_name, trace)
        self.clock = Clock(backend.loop)
        self.io = Stage1Io(backend, stage1, self.health, self.clock)  # and the watch
        # CASSINI's placements, start delays and pauses (its own `shift_ms` without one)
        self.align = Alignment(grid, spec, self.clock, profiler, backend.pause, self.records)
        self.t0 = 0
        self.left = len(requests)
        self._done: asyncio.Future[None] | None = None
        self._stuck_ns: int | None = None  # since when nothing runs and nothing fits
        self._recheck: asyncio.TimerHandle | None = None  # the next look at the queue
        # the service's time limits: each started job's end (clock ns) and its timer
        self.deadlines = Deadlines(self.clock, self.cancel)

    # --- the run -----------------------------------------------------------------------
    def open(self) -> None:
        """The clock's origin (the watch starts with the first job: before it, nobody is
        bound to beat)."""
        self.t0 = self.clock.now_ns()

    def close(self) -> None:
        self.io.stop_watch()
        if self._recheck is not None:
            self._recheck.cancel()
        self.deadlines.close()

    def run(self) -> dict[str, JobRecord]:
        loop = self.b.loop
        self._done = loop.create_future()
        # a run stopped (Ctrl-C) leaves it unawaited, and a job its nodes then fail sets
        # it: read here, not logged with a traceback when collected
        self._done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.open()
        total = sum(r.iterations for r in self.requests)
        self.told.run(self.experiment, "started", total)
        for req in self.requests:
            self.clock.call_at_ns(self.t0 + req.arrival_ns, self._arrive, req)
        if not self.requests:
            self._done.set_result(None)
        state: Literal["finished", "failed"] = "failed"
        try:
            loop.run_until_complete(self._done)
            state = "finished"
        except Stalled as e:
            missing = self.b.monitor.undelivered()
            raise RunFailed(f"{self.spec.name}: the run stalled with nothing left to do; "
                            f"{len(missing)} flows undelivered, e.g. ids {missing[:5]}"
                            ) from e
        finally:
            self.close()
            self.told.health()
            self.told.run(self.experiment, state, total,
                          [t for r in self.records.values() for t in r.iteration_ns])
        return self.records

    def submit(self, req: JobRequest, resume: int = 0, life: int = 0) -> None:
        """The service: a job arrives now, to go on from iteration `resume` (one an earlier
        arbiter, or attempt, recorded), in its `life`-th time in the queue."""
        if self.jobs.add(req.name, self.clock.now_ns() - self.t0) is None:
            raise RunFailed(f"{MAX_TAG} jobs already: at most {MAX_TAG} at once")
        self.left += 1
        if resume:
            self.jobs.resume[req.name] = resume
        if life:
            self.jobs.life[req.name] = life
        self._arrive(req)

    def cancel(self, name: str, why: str) -> bool:
        """The service: end a queued or running job now (False: it is not here)."""
        queued = next((q for q in self.queue if q.name == name), None)
        if queued is not None:
            self.queue.remove(queued)
            self._leave(name, None, "cancelled", why)
            return True
        if name in self.jobs.setting_up and name not in self.jobs.cancelling:
            self.jobs.cancelling[name] = why  # it ends as its stage 1 does
            return True
        task = self.jobs.tasks.get(name)
        if task is None or name in self.jobs.cancelling:
            return False
        self.jobs.cancelling[name] = why
        task.cancel()  # a stopping job is ended once it has stopped
        return True

    def set_time_limit(self, name: str, limit_ns: int) -> bool:
        """The service: a queued or started job's new time limit, from its first start
        (False: it is not here)."""
        if (i := next((i for i, q in enumerate(self.queue) if q.name == name), None)) is not None:
            self.queue[i] = replace(self.queue[i], time_limit_ns=limit_ns)
        elif name not in self.jobs.setting_up and name not in self.jobs.tasks:
            return False
        self.deadlines.change(name, limit_ns)
        return True

    def reprioritise(self, name: str, priority: int) -> bool:
        """The service: a queued job to its place for a new priority (False: not queued)."""
        queued = next((q for q in self.queue if q.name == name), None)
        if queued is None:
            return False
        self.queue.remove(queued)
        self._arrive(replace(queued, priority=priority))
        return True

    def look(self) -> None:
        """The service: the queue again, now (a job released, a limit raised)."""
        self._admit()

    def started(self) -> list[Running]:
        """The jobs that hold partitions now, as backfill sees them: their nodes and when
        their time limits end (NEVER: none)."""
        out = []
        for name in self.jobs.tasks:
            part = self.records[name].partition
            if part is not None:
                out.append(Running(self.deadlines.end_of(name) or NEVER, frozenset(part.nodes),
                                   name))
        now = self.clock.now_ns()
        for name, (req, part) in self.jobs.setting_up.items():  # its time limit starts with it
            end = self.deadlines.end_of(name) or (
                now + req.time_limit_ns if req.time_limit_ns else NEVER)
            out.append(Running(end, frozenset(part.nodes), name))
        return out

    def setting_up(self) -> dict[str, str]:
        """The jobs whose stage 1 is under way now, and where."""
        return {name: part.describe() for name, (_req, part) in self.jobs.setting_up.items()}

    def _arrive(self, req: JobRequest) -> None:
        """Into the queue by priority (higher first), then arrival."""
        at = next((i for i, q in enumerate(self.queue) if q.priority < req.priority),
                  len(self.queue))
        self.queue.insert(at, req)
        self._admit()

    def _lose(self, name: str, part: Partition | None, e: BaseException) -> None:
        """A job that cannot go on: in a run, the run fails; in the service, that job ends
        alone (failed) and the others go on."""
        if self.service is None:
            self._fail(e)
            return
        self._leave(name, part, "failed", str(e))

    def _leave(self, name: str, part: Partition | None, state: str, why: str) -> None:
        """A job leaves ("finished", or in the service "failed" or "cancelled"): its
        partition (if it holds one) goes back, unless a device refuses to clear it (a run
        then fails; the service keeps those nodes out and says so); the service is told;
        the next jobs start, or the run is done."""
        rec = self.records[name]
        # its last iteration's end, where that was a copy written before its time
        rec.end_ns = max(self.clock.now_ns(), self.jobs.last.get(name, 0)) - self.t0
        rec.violations = self.b.monitor.count_of(self.jobs.attempts.pop(name, []))
        self.jobs.tasks.pop(name, None)
        self.jobs.cancelling.pop(name, None)
        if self.deadlines.ended(name) and state == "cancelled":
            state = "timeout"
        if part is None:
            self._gone(rec, state, why)
            return

        def released(e: BaseException | None) -> None:
            if e is None:
                self._give(name, part)
                self._gone(rec, state, why)
            elif self.service is None:
                self._fail(RunFailed(f"{self.spec.name}: job {name} left: {e}"))
            else:
                for n in part.nodes:
                    self.closed[n] = f"not cleared after job {name}: {e}"
                self.service.on_hold(name, 0)
                self._gone(rec, state, (f"{why}; " if why else "")
                           + f"its partition was not given back: {e}")

        self.io.release(name, released)

    def _gone(self, rec: JobRecord, state: str, why: str) -> None:
        """A job has left, its partition given back: the service is told; the next jobs
        start, or the run is done."""
        name = rec.name
        self.left -= 1
        if self.service is not None:
            self.service.on_end(rec, state, why)
            # it keeps nothing of a job that has ended (the ledger has it): a long-lived
            # arbiter's memory stays bounded
            self.jobs.forget(name)
            self.outcomes.clear()  # a run's figures; the service reports per job
            self.recoveries.clear()
        if self.left == 0 and self._done is not None and not self._done.done():
            self._done.set_result(None)
        else:
            self._admit()

    def _take(self, name: str, part: Partition) -> None:
        self.free -= set(part.nodes)
        if self.service is not None:
            self.service.on_hold(name, len(part.nodes))

    def _give(self, name: str, part: Partition) -> None:
        self.free |= set(part.nodes)
        if self.service is not None:
            self.service.on_hold(name, 0)

    def _admit(self) -> None:
        """Start what can start now (`_admit_once`). A job that ends meanwhile (it failed
        to start, it could never run) asks again: once this pass is over, not inside it
        (issue 64: a queue of 600 failed one inside another, to a RecursionError)."""
        if self._admitting:
            self._again = True
            return
        self._admitting = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._admit_once()
        finally:
            self._admitting = False

    def _admit_once(self) -> None:
        """Start every queued job that can start now on nodes in service. While nodes are
        out of service, look again every heartbeat period: one that comes back (a board
        that beats again) may be what the head of the queue waits for."""
        health = self.health
        if self.service is not None:  # jobs going on after a stop first, then by rank now
            ranked = {q.name: self.service.rank(q) for q in self.queue}
            self.queue.sort(key=lambda q: (q.name not in self.jobs.stopped, -ranked[q.name]))
        try:
            placed = self.placer.place(self.free - set(self.closed), health, self.queue,
                                       self.started(), self.clock.now_ns())
        except RunFailed as e:  # it can never run again
            st = self.jobs.stopped.get(self.queue[0].name) if self.queue else None
            why = "; ".join(str(d) for d in st.found if DIAGNOSES.get(d.kind)) if st else ""
            self._fail(RunFailed(f"{self.spec.name}: {why}: {e}" if why else
                                 f"{self.spec.name}: {e}"))
            return
        for k, (req, part) in enumerate(placed):
            self.queue[:] = [q for q in self.queue if q.name != req.name]
            part = self.align.place(req, part, self.free - {n for j, (_r, p) in enumerate(
                placed) if j != k for n in p.nodes})
            self._take(req.name, part)
            try:
                started = self._start(req, part)
            except Exception as e:
                self._start_failed(req, part, e)
                return
            if not started:  # its stage 1 failed at once (a model's), and was dealt with
                return
        if not self.jobs.setting_up:  # every start went through
            self.jobs.tries.clear()
        down = health.out_of_service()
        now = self.clock.now_ns()
        # the jobs the queue's rules let start (a held job waits for its operator)
        ready = [q for q in self.queue if self.placer.eligible(q)]
        # nodes held (a job setting up, running, stopping, going dark, being released)
        held = set(self.grid.nodes) - self.free - set(self.closed)
        # (the service's queue waits: a job it took fits the grid, and its nodes come back
        # or an operator says why not; a run's ends)
        if self.service is not None or not ready or self.running or self.io.busy or held:
            self._stuck_ns = None
        elif self._stuck_ns is None:  # every node free, and still none fits
            self._stuck_ns = now
        grace_ns = self.tb.monitor.grace_ms * 1e6
        if self._stuck_ns is not None and (not down or now - self._stuck_ns >= grace_ns):
            req = ready[0]
            shape = "" if req.shape == "any" else f"{req.shape} "
            self._lose(req.name, None, RunFailed(
                f"{self.spec.name}: job {req.name}: no {shape}rectangle of the nodes in "
                f"service holds {req.ranks} ranks; out of service: {', '.join(sorted(down))}"
                f" (waited {(now - self._stuck_ns) / 1e6:.0f} ms for them, grace_ms)"))
        elif self.queue and down and self._recheck is None:
            self._recheck = self.clock.call_later_ns(health.period_ns, self._look_again)

    def _device_failed(self, req: JobRequest, e: DeviceFailed) -> None:
        """A device failed its part of a job's stage 1: the watch is told, and the job is
        placed and planned again round it (a bounded number of times)."""
        tries = self.jobs.tries[req.name] = self.jobs.tries.get(req.name, 0) + 1
        if tries > len(self.b.wss) + len(self.grid.nodes):
            self._lose(req.name, None, RunFailed(
                f"{self.spec.name}: job {req.name}: stage 1 failed {tries} times; the last: "
                f"{e}"))
            return
        self.io.tell(e, "apply")
        self.queue.insert(0, req)
        self._admit()

    def _start_failed(self, req: JobRequest, part: Partition, e: BaseException) -> None:
        """A job that did not start gives its nodes back: a device that failed its stage
        1 is gone round (placed and planned again); anything else fails the job, saying
        which; a job cancelled meanwhile ends so."""
        self._give(req.name, part)
        if req.name in self.jobs.cancelling:
            self._leave(req.name, None, "cancelled", self.jobs.cancelling[req.name])
        elif isinstance(e, DeviceFailed):  # found while applying: go round it too
            self._device_failed(req, e)
        elif isinstance(e, Exception):
            self._lose(req.name, None, self._cannot_start(req, part, e))
        else:
            raise e

    def _cannot_start(self, req: JobRequest, part: Partition, e: Exception) -> Exception:
        if req.name in self.jobs.stopped:
            found = "; ".join(map(str, self.health.actionable(part.nodes)))
            return RunFailed(f"{self.spec.name}: job {req.name}: no plan round {found}: {e}")
        if isinstance(e, PlanError):  # the config's doing: the CLI says so
            return e if part.shape == WHOLE else \
                PlanError(f"job {req.name} on {part.describe()}: {e}")
        return RunFailed(f"{self.spec.name}: job {req.name} on {part.describe()}: {e}")

    def _look_again(self) -> None:
        self._recheck = None
        if self._done is None or not self._done.done():  # the service, or a run going on
            self._admit()

    def _start(self, req: JobRequest, part: Partition) -> bool:
        """A placed job's stage 1 begins, off the loop (the job then begins: `_begin`).
        False: it failed at once (a model's stage 1 runs at once), and was dealt with."""
        schedule = schedule_of(req, part, self.spec)
        self.io.start_watch()
        since = len(self.health.diagnoses)  # what its plan goes round
        avoid = self.health.avoid()
        self.jobs.setting_up[req.name] = (req, part)
        failed = False

        def set_up(got: tuple[Routes, bool, Plan | None] | BaseException) -> None:
            nonlocal failed
            del self.jobs.setting_up[req.name]
            if isinstance(got, BaseException):
                failed = True
                self._start_failed(req, part, got)
            elif req.name in self.jobs.cancelling:  # cancelled meanwhile: undone, and it ends
                self._leave(req.name, part, "cancelled", self.jobs.cancelling[req.name])
            else:
                self.jobs.tries.pop(req.name, None)
                try:
                    self._begin(req, part, schedule, since, *got)
                except Exception as e:
                    failed = True
                    self._start_failed(req, part, e)

        self.io.run(lambda: self.stage1.admit(req, part, schedule, avoid), set_up)
        return not failed

    def _begin(self, req: JobRequest, part: Partition, schedule: Schedule, since: int,
               routes: Routes, nic_sync: bool, plan: Plan | None) -> None:
        """A job whose stage 1 is in place runs (after its start delay)."""
        rec = self.records[req.name]
        rec.plan = plan
        if plan is not None:
            self.told.say("plan", lambda: plan_note(self.spec.name, plan))
        now = self.clock.now_ns()
        rec.partition, rec.placed_ns = part, now - self.t0
        if rec.start_ns is None:
            rec.start_ns = rec.placed_ns
        self.deadlines.begin(req.name, req.time_limit_ns)
        carry: tuple[int, list[tuple[int, int, int]]] | None = None
        if req.name in self.jobs.stopped:  # it goes on, after a fault
            st = self.jobs.stopped.pop(req.name)
            # every rank where it was (none died): the cut iteration goes on from where
            # it stopped, with what was delivered; else it runs again in full
            if st.stop.carry is not None and st.ranks == tuple(part.ranks):
                carry = st.stop.carry
            self.recoveries.append(Recovery(st.t_stop_ns, now, st.t_last_ns, st.found,
                                            st.stop.lost and carry is None,
                                            st.stop.flows_lost, st.replan))
            rec.stops[-1]["resumed_on"] = part.describe()
            rec.stops[-1]["carried_flows"] = len(carry[1]) if carry else None
        self.running += 1
        # a stopped id is not reused, nor one of a life before in the queue
        attempt = (f"q{self.jobs.life[req.name]}" if req.name in self.jobs.life else "") + (
            f"r{len(rec.stops)}" if rec.stops else "")
        job = job_id(self.run_name, self.spec.name, req.name, attempt)
        shift_ns = self.align.shift(req, part, schedule, rec, job)
        in_grid = set(part.nodes)
        trace_its = self.trace.iterations if self.trace is not None else 0
        spec = JobSpec(
            v=JOB_VERSION, job=job,
            collective=req.collective, size=req.size, rows=len(part.rows),
            cols=len(part.cols), degree=self.spec.degree, bidirectional=self.spec.bidirectional,
            ranks=list(part.ranks), nodes=[n for n in self.grid.nodes if n in in_grid],
            iterations=req.iterations, compute_ns=req.compute_ns,
            # the O-NICs' counts start at zero: what a carry delivered is counted by the host
            nic_sync=nic_sync and carry is None, timing=timing_of(self.tb), routes=routes,
            start=self.jobs.resume.get(req.name, 0), trace_iterations=trace_its,
            tag=self.jobs.tags[req.name], alltoall=req.alltoall, weight=req.weight,
            carried=carry is not None, carry=carry[1] if carry else [],
            carry_t0=carry[0] if carry else 0, hybrid=req.hybrid, overlap=req.overlap,
            record_flows=self.record_flows)
        self.jobs.attempts.setdefault(req.name, []).append(spec.job)
        stop = self.jobs.rules[req.name] = StopRule(
            self.health, frozenset(part.nodes), since,
            self.tb.monitor.missed * self.health.period_ns)

        def on_iteration(it: Iteration) -> None:
            rec.iteration_ns.append(it.t_end - it.t_start)
            # (a copy is written before its time comes: at its end)
            self.jobs.last[req.name] = self.clock.now_ns() if it.repeats is None else it.t_end
            self.align.iterated(req.name, it.t_end)
            if self.on_iteration is not None:
                self.on_iteration(rec, it)
            # (tag 0: the run's only job)
            self.told.iteration(req.name if self.jobs.tags[req.name] else "", req.iterations,
                                it)

        task = self.jobs.tasks[req.name] = self.b.loop.create_task(
            self._run(req.name, spec, on_iteration, shift_ns, stop))
        task.add_done_callback(lambda t: self._finish(req, part, t))

    async def _run(self, name: str, spec: JobSpec, on_iteration: Callable[[Iteration], None],
                   shift_ns: int, stop: StopRule) -> Any:
        """The job, after its start delay (`Alignment.delay`)."""
        await self.align.delay(name, shift_ns)
        return await self.b.run_job(spec, on_iteration, self.record_flows, stop,
                                    self.extend)

    def _finish(self, req: JobRequest, part: Partition, task: asyncio.Task[Any]) -> None:
        rec = self.records[req.name]
        spec_id = self.align.left(req.name)
        if task.cancelled():  # the service cancelled it (or its time limit)
            self.running -= 1
            if req.name not in self.jobs.cancelling and self.service is not None:
                # no: the service's loop is stopping (Ctrl-C of the arbiter). The job has
                # not ended; the ledger keeps it running for the next arbiter to go on
                # with (recording it cancelled lost it: issue 62's restart test, 3 of 10)
                return
            if (cut := self.b.cut.pop(spec_id or "", None)) is not None:
                self.outcomes.append(cut)
                rec.took(cut)  # as far as its ranks said, as they dropped it
            why = self.jobs.cancelling.get(req.name, "")
            dark = self.b.loop.create_task(self._dark(part))
            dark.add_done_callback(lambda _t: self._leave(req.name, part, "cancelled", why))
            return
        exc = task.exception()
        if isinstance(exc, JobStopped) and len(rec.stops) < MAX_STOPS:
            # it holds its partition (and counts as running) until `_stop` gives it back
            stopping = self.b.loop.create_task(self._stop(req, part, exc))

            def lost(t: asyncio.Task[None]) -> None:  # the stop itself failed: the job too
                if not t.cancelled() and (e := t.exception()) is not None:
                    self.running -= 1
                    self._lose(req.name, part, e)

            stopping.add_done_callback(lost)
            return
        self.running -= 1
        if isinstance(exc, JobStopped):
            exc = RunFailed(f"{self.spec.name}: job {req.name}: {STOPPED_TOO_OFTEN} "
                            f"{len(rec.stops) + 1} times; the last: {exc}")
        if exc is not None:
            self._lose(req.name, part, exc)
            return
        out = task.result()
        self.outcomes.append(out)
        if self.trace is not None:
            self.trace.chrome.rows[self.spec.name] += out.trace
        rec.took(out)
        self._leave(req.name, part, "finished", "")

    async def _dark(self, part: Partition) -> None:
        """Until no live board of a cancelled job's partition transmits (`grace_ms` at
        most; a board that cannot be asked is the watch's to judge): its last flows land
        before its nodes go to the next job, as a job stopped for a fault waits (`_stop`)."""
        with contextlib.suppress(Exception):
            await landed(self.health, self.b.onics, part.nodes,
                         self.tb.monitor.grace_ms * 1e6, settled=False)

    async def _stop(self, req: JobRequest, part: Partition, stop: JobStopped) -> None:
        """A job stopped for a fault on its partition: once the watch has settled, the bus
        is back and the job's light has landed (`grace_ms` at most; a bus still down then
        fails the run), the partition goes back to the pool and the job to the head of
        the queue."""
        health, now = self.health, self.clock.now_ns()
        # its last iteration recorded before the stop: one whose reports its ranks say again
        # once the bus is back (below) is heard after the outage, and would hide it
        last_ns = self.jobs.last.get(req.name, now)
        rec = self.records[req.name]
        self.outcomes.append(stop.outcome)
        rec.took(stop.outcome)
        rec.held_ns += len(part.nodes) * (now - self.t0 - rec.placed_ns)
        mon = self.tb.monitor
        if not await landed(health, self.b.onics, part.nodes, mon.grace_ms * 1e6,
                            settled=True) and health.bus_down_since is not None:
            down_s = (self.clock.now_ns() - health.bus_down_since) / 1e9
            raise RunFailed(f"{self.spec.name}: job {req.name}: {stop}; the bus did not "
                            f"come back within grace_ms = {mon.grace_ms:g}: the broker "
                            f"({self.tb.broker.url}) unreachable for {down_s:.1f} s (is "
                            f"its emulator or Mosquitto running?)")
        if stop.carrying is not None:  # its ranks say what the cut iteration delivered
            # (on a starved host they say it late: waited for as their heartbeats are)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CARRY_WAIT_S + health.patience_ns(part.ranks) / 1e9):
                    await stop.carrying.wait()
        released: asyncio.Future[BaseException | None] = self.b.loop.create_future()
        self.io.release(req.name, released.set_result)
        if (e := await released) is not None:  # (a model's is done at once: no wait)
            raise e
        self._give(req.name, part)
        rule = self.jobs.rules[req.name]
        self.jobs.stopped[req.name] = Stopped(now, last_ns, stop,
                                           rule.pending(), bool(rule.faults()),
                                           tuple(part.ranks))
        self.jobs.resume[req.name] = stop.next_iteration
        rec.stops.append({"at_s": round((now - self.t0) / 1e9, 9), "why": str(stop),
                          "ran_on": part.describe(), "from_iteration": stop.next_iteration})
        self.running -= 1
        self.told.health()
        self.jobs.tasks.pop(req.name, None)
        if req.name in self.jobs.cancelling:  # cancelled while it stopped
            self._leave(req.name, None, "cancelled", self.jobs.cancelling[req.name])
            return
        self.queue.insert(0, req)
        self._admit()

    def _fail(self, e: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(e)
