"""The experiment runner: one workload, several networks, the same job runner for each.

For each network it asks the registry for a back end, runs stage 1 (inventory, plan,
apply, read back) where the network has one, hands the job to the back end and records
every iteration as it completes. It does not know which back end it has.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import msgspec
from oddl.controller import registry
from oddl.controller.admission import (
    Admission,
    JobRecord,
    JobRequest,
    NoStage1,
    OddlStage1,
    Stage1,
    percentile,
)
from oddl.controller.arbiter import ApplyError, Arbiter, DeviceFailed
from oddl.controller.backend import (
    Announce,
    Backend,
    Iteration,
    JobOutcome,
    JobStopped,
    RunFailed,
    disturbance,
)
from oddl.controller.clock import Clock
from oddl.controller.collectives import Schedule, build
from oddl.controller.config import ConfigError, ConfigIssue, LoadedExperiment, NetworkSpec
from oddl.controller.figures import wire_ns
from oddl.controller.health import Watch
from oddl.controller.invariants import InvariantChecker
from oddl.controller.job import (
    JOB_VERSION,
    JobSpec,
    job_id,
    nic_programs,
    timing_of,
    wire_routes,
)
from oddl.controller.placement import fits
from oddl.controller.plan import Plan, PlanError
from oddl.controller.planner import NO_FAULTS, Avoid
from oddl.controller.recovery import FaultRow, Recovery, fault_rows, replace_ranks
from oddl.controller.results import RunStore
from oddl.controller.telemetry import (
    TELEMETRY_VERSION,
    IterationNote,
    RunNote,
    health_note,
    plan_note,
)
from oddl.controller.topology import Grid
from oddl.controller.trace import ChromeTrace
from oddl.controller.workloads import model_spec, total_iterations

log = logging.getLogger(__name__)
__all__ = ["NetworkResult", "NetworkRun", "RunFailed", "RunResult", "run_experiment"]


@dataclass
class NetworkResult:
    name: str
    kind: str
    training_time_s: float
    iteration_time_s: float
    iterations: int
    flows: int
    control_messages: int
    invariant_violations: int
    stats: dict[str, Any] = field(default_factory=dict)
    disturbance: dict[str, int] = field(default_factory=dict)  # backend.DISTURBANCES
    disturbed: bool = False  # more of them than the experiment's threshold allows
    faults: list[dict[str, Any]] = field(default_factory=list)  # recovery.FaultRow
    # time the faults cost: from the last iteration before each stop to the resume (in
    # training_time_s too: an iteration cut short and the recovery happened once)
    fault_time_s: float = 0.0
    # several jobs: mean_jct_s, p99_jct_s, makespan_s, utilisation, mean_queued_s
    fabric: dict[str, float] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()
                if k not in ("name", "kind", "stats") and (k != "fabric" or v)}


@dataclass
class RunResult:
    experiment: str
    backend: str
    networks: dict[str, NetworkResult]
    ratio: float | None
    invariant_violations: int
    wall_s: float
    compute_ns: int
    calibration: str
    iterations: int
    total_iterations: int
    run_dir: str | None = None
    violations: list[str] = field(default_factory=list)
    # several jobs (docs/multijob.md): job -> network -> admission.JobRecord.public()
    jobs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "backend": self.backend,
            "networks": {n: r.public() for n, r in self.networks.items()},
            "ratio": self.ratio,
            "invariant_violations": self.invariant_violations,
            "wall_s": round(self.wall_s, 3),
        } | ({"jobs": self.jobs} if self.jobs else {})


Progress = Callable[[str, int, int], None]  # network, done, total


MAX_RECOVERIES = 16  # stops one network's run may come back from


class NetworkRun:
    """One network of an experiment: its back end, stage 1 where it has one, its job,
    and (ODDL-SPEC stage 1, step 4) the watch that stops, re-plans and resumes it
    round faults."""

    def __init__(self, ctx: LoadedExperiment, spec: NetworkSpec, grid: Grid,
                 schedule: Schedule, backend: str, checker_mode: str,
                 announce: Announce | None = None) -> None:
        tb, exp, w = ctx.testbed, ctx.experiment, ctx.workload
        self.ctx, self.spec, self.grid, self.schedule = ctx, spec, grid, schedule
        self.ranks = list(grid.nodes[: len(schedule)])
        self.collective = spec.collective or w.collective
        self.size = model_spec(w.model).grad_bytes(w.bytes_per_param)
        self.plan: Plan | None = None
        self.plan_s = 0.0
        self.recoveries: list[Recovery] = []
        self.arbiter: Arbiter | None = None
        self.watch: Watch | None = None
        self.nic_sync = False
        self.routes: dict[str, dict[str, tuple[str, int, str]]] = {}
        if spec.kind == "oddl":  # stage 1 on the testbed's devices, whichever back end
            self.backend = registry.open_backend(backend, tb, grid, faults=exp.faults,
                                                 seed=exp.seed, checker_mode=checker_mode,
                                                 announce=announce)
            self.arbiter = Arbiter(tb, grid, self.backend.onics, self.backend.wss)
            self.arbiter.inventory()
            gc.collect()  # time the planner, not a collection of an earlier run's garbage
            self.plan_s = self._stage1(NO_FAULTS)
        else:  # a baseline: a flow-level model in every back end
            self.backend = registry.open_model(spec, tb, self.ranks, checker_mode, announce)
        self.job = JobSpec(
            JOB_VERSION, job_id(exp.name, spec.name, os.getpid(), time.time_ns()),
            self.collective, self.size, tb.grid.rows, tb.grid.cols, spec.degree, spec.bidirectional,
            self.ranks,
            list(grid.nodes), 1, 0, self.nic_sync, timing_of(tb), self.routes)
        self.outcome: JobOutcome | None = None

    def _stage1(self, avoid: Avoid) -> float:
        """Plan for the current ranks round `avoid`, apply, read back; the planning time."""
        assert self.arbiter is not None
        t_plan = time.perf_counter()
        self.plan = self.arbiter.plan(self.schedule, self.spec.strategy, relay=self.spec.relay,
                                      ranks=self.ranks, avoid=avoid)
        plan_s = time.perf_counter() - t_plan
        programs = nic_programs(self.schedule, self.ranks)
        self.nic_sync = programs is not None
        self.arbiter.apply(self.plan, programs)
        self.routes = wire_routes(self.plan)
        plan = self.plan
        self._say("plan", lambda: plan_note(self.spec.name, plan))
        if self.watch is not None:
            self.watch.expected = {t.wss: t.table for t in self.plan.wss}
        return plan_s

    def _say(self, kind: str, note: Callable[[], Any]) -> None:
        """Tell the bus's watchers (the dashboard), if the back end tells anybody (the
        note is built only then: this runs every iteration)."""
        if self.backend.announce is not None:
            self.backend.announce(kind, msgspec.json.encode(note()))

    def _say_health(self) -> None:
        h = self.backend.health
        self._said_health = (len(h.diagnoses) if h else 0, len(self.backend.injected))
        self._say("health", lambda: health_note(self.spec.name, h.diagnoses if h else [],
                                                self.backend.injected))

    def _live(self) -> list[str]:
        """The nodes a job is handed to: all but the dead (whose program cannot say
        "ready"; no plan routes through them)."""
        h = self.backend.health
        return [n for n in self.grid.nodes if h is None or not h.is_dead(n)]

    @property
    def monitor(self) -> InvariantChecker:
        return self.backend.monitor

    def run(self, n_iter: int, compute_ns: int, store: RunStore | None,
            progress: Progress | None, record_flows: bool,
            trace: Timeline | None = None) -> list[tuple[int, int]]:
        """Run the job; record every iteration as it completes (a killed run keeps them);
        stop, recover and resume round whatever faults the watch finds; the first
        `trace.iterations` iterations' timelines go to `trace`."""
        name = self.spec.name
        times: list[tuple[int, int]] = []

        def on_iteration(it: Iteration) -> None:
            times.append((it.t_start, it.t_end))
            if store is not None:
                store.add_iteration(name, it.iteration, it.t_start, it.t_end, compute_ns,
                                    it.control_messages, it.flows)
            if progress is not None:
                progress(name, it.iteration + 1, n_iter)
            self._say("iteration", lambda: IterationNote(
                TELEMETRY_VERSION, name, it.iteration, (it.t_end - it.t_start) / 1e6,
                it.control_messages, self.job.job))
            h = b.health
            if (len(h.diagnoses) if h else 0, len(b.injected)) != self._said_health:
                self._say_health()
            if trace is not None:  # rows come late: the last RELEASEs with the next one
                trace.chrome.rows[name] += it.trace
                if it.iteration < trace.iterations:
                    trace.chrome.iterations[name].append((it.iteration, it.t_start, it.t_end))

        b = self.backend
        total = JobOutcome(0, 0, {}, [])
        exp = self.ctx.experiment.name
        self._say("run", lambda: RunNote(TELEMETRY_VERSION, exp, name, b.name, "started",
                                         n_iter))
        self._said_health = (-1, -1)
        state: Literal["finished", "failed"] = "failed"
        if b.health is not None and self.plan is not None:
            self.watch = Watch(Clock(b.loop), b.health, b.wss)
            self.watch.expected = {t.wss: t.table for t in self.plan.wss}
            self.watch.start()
        try:
            while True:
                attempt = len(self.recoveries)
                job = msgspec.structs.replace(
                    self.job, job=self.job.job[:120] + (f"-r{attempt}" if attempt else ""),
                    iterations=n_iter, compute_ns=compute_ns, start=len(times),
                    ranks=self.ranks, collective=self.collective, nic_sync=self.nic_sync,
                    routes=self.routes, nodes=self._live(),
                    trace_iterations=trace.iterations if trace is not None else 0)
                try:
                    _add(total, b.loop.run_until_complete(b.run_job(job, on_iteration,
                                                                    record_flows)))
                    break
                except JobStopped as e:
                    _add(total, e.outcome)
                    if attempt >= MAX_RECOVERIES:
                        raise RunFailed(f"{name}: stopped by faults {attempt + 1} times; "
                                        f"last: {e}") from e
                    self._recover(e, len(times), times[-1][1] if times else 0)
                    self._say_health()
            state = "finished"
        except RuntimeError as e:
            if "deadlock" not in str(e):
                raise
            missing = self.monitor.undelivered()
            raise RunFailed(f"{name}: the run stalled with nothing left to do; "
                            f"{len(missing)} flows undelivered, e.g. ids {missing[:5]}") from e
        finally:
            if self.watch is not None:
                self.watch.stop()
            self._say_health()
            self._say("run", lambda: RunNote(TELEMETRY_VERSION, exp, name, b.name, state,
                                             n_iter, f"{len(times)} iterations"))
            b.close()
        self.outcome = total
        if trace is not None:
            trace.chrome.rows[name] += total.trace
        self.monitor.finish(times[-1][1] if times else 0)
        return times

    def _recover(self, stop: JobStopped, next_iteration: int, t_last: int) -> None:
        """Let the watch settle on what broke; go round it per the policy; apply; resume."""
        b, health = self.backend, self.backend.health
        if health is None or self.arbiter is None:
            raise RunFailed(f"{self.spec.name}: {stop}") from stop
        t_stop = Clock(b.loop).now_ns()
        b.loop.run_until_complete(self._settle(stop))
        found = health.pending()
        act = health.actionable()
        # nothing to go round (a bus that blinked, a peer that failed once): the same plan
        # again; a peer that fails the job twice is found unresponsive, and MAX_RECOVERIES
        # bounds the rest
        for _ in range(len(b.wss) + len(self.grid.nodes) + 1) if act else ():
            avoid = health.avoid()
            try:
                ranks, coll = replace_ranks(self.ranks, set(avoid.nodes), self.grid.nodes,
                                            self.ctx.experiment.recovery, self.collective)
            except RunFailed as e:
                raise RunFailed(f"{self.spec.name}: {'; '.join(map(str, act))}: {e}") from e
            if ranks != self.ranks or coll != self.collective:
                self.schedule = build(coll, len(ranks), self.size, self.grid.rows,
                                      self.grid.cols, self.spec.degree,
                                      self.spec.bidirectional)
            self.ranks, self.collective = ranks, coll
            try:
                self._stage1(avoid)
                break
            except DeviceFailed as e:  # found while applying: go round it too
                now = Clock(b.loop).now_ns()
                if e.what == "WSS":
                    health.wss_answer(e.target, now, f"no answer to the apply: {e}")
                else:
                    health.will(e.target, now)
            except (PlanError, ApplyError) as e:
                raise RunFailed(f"{self.spec.name}: no plan round "
                                f"{'; '.join(map(str, health.actionable()))}: {e}") from e
        health.handled = len(health.diagnoses)
        rec = Recovery(t_stop, Clock(b.loop).now_ns(), t_last, found, stop.lost,
                       stop.flows_lost, bool(act))
        self.recoveries.append(rec)
        log.warning("%s: %s; %s; resuming at iteration %d on %d ranks (%s)", self.spec.name,
                    stop, "re-planned round " + "; ".join(map(str, act)) if act else
                    "same plan", next_iteration, len(self.ranks), self.collective)

    async def _settle(self, stop: JobStopped) -> None:
        """Until the watch has a verdict: suspects judged, the bus back, and (for an
        iteration cut short) a fault found, or `grace_ms` passes."""
        health = self.backend.health
        assert health is not None
        mon = self.ctx.testbed.monitor
        period = health.period_ns / 1e9
        waited = 0.0
        while True:
            # the stopped job's light must have landed before a new plan takes the fibres
            dark = not any(o.transmitting() for n, o in self.backend.onics.items()
                           if not health.is_dead(n))
            if health.bus_down_since is None and health.settled() and dark:
                return
            if waited * 1e3 >= mon.grace_ms:
                if health.bus_down_since is not None:
                    raise RunFailed(f"{self.spec.name}: {stop}; the bus did not come back "
                                    f"within grace_ms = {mon.grace_ms:g}")
                return
            await asyncio.sleep(period)
            waited += period

    def stats(self) -> dict[str, Any]:
        assert self.outcome is not None
        extra = {"plan_s": round(self.plan_s, 4)} if self.plan is not None else {}
        return {**self.outcome.stats, **extra}

    def faults(self, completed: bool) -> list[FaultRow]:
        h = self.backend.health
        return fault_rows(self.backend.injected, h.diagnoses if h is not None else [],
                          self.recoveries, completed)


def _add(total: JobOutcome, part: JobOutcome) -> None:
    """Sum the attempts of one job: messages, flows, counters; the latest non-counters."""
    total.control_messages += part.control_messages
    total.flows += part.flows
    for k, v in part.stats.items():
        if isinstance(v, int) and not isinstance(v, bool) and k not in _ABSOLUTE:
            total.stats[k] = total.stats.get(k, 0) + v
        else:
            total.stats[k] = v
    total.violations[:] = part.violations
    total.trace += part.trace


# counters a back end reports for its whole life, not per job (summing them would count
# the earlier attempts twice)
_ABSOLUTE = ("dropped", "messages_dropped", "messages_delayed", "transfers", "tunes",
             "lost_to_faults", "count_action_fires", "diameter")


@dataclass
class Timeline:
    """What `oddl run --trace` asks for: the first `iterations` of every network."""

    iterations: int
    chrome: ChromeTrace = field(default_factory=ChromeTrace)


def run_jobs(ctx: LoadedExperiment, backend: str = "sim", store: RunStore | None = None,
             progress: Progress | None = None, checker_mode: str = "record",
             announce: Announce | None = None) -> RunResult:
    """Several jobs (docs/multijob.md): the same trace on every network, each job placed,
    planned and admitted as it arrives, all on one clock; per job JCT, queueing and
    iteration times, per network JCT summary, makespan and utilisation."""
    t_wall = time.perf_counter()
    exp, tb = ctx.experiment, ctx.testbed
    grid = Grid.from_testbed(tb)
    reqs = [JobRequest.of(e) for e in ctx.jobs]
    issues = [ConfigIssue(str(ctx.path), f"job {r.name!r}.shape", f"no {r.shape} rectangle of "
                          f"{tb.grid.rows} x {tb.grid.cols} holds {r.ranks} ranks"
                          f"{' exactly (hier2d)' if r.exact else ''}")
              for r in reqs if not fits(grid, r.ranks, r.shape, r.exact)]
    if issues:
        raise ConfigError(issues)
    total = sum(r.iterations for r in reqs)
    done = dict.fromkeys((s.name for s in exp.networks), 0)

    def on_iteration(network: str, rec: JobRecord, it: Iteration) -> None:
        done[network] += 1
        if store is not None:
            store.add_job_iteration(network, rec.name, it.iteration, it.t_start, it.t_end)
        if progress is not None:
            progress(network, done[network], total)

    results: dict[str, NetworkResult] = {}
    jobs: dict[str, dict[str, dict[str, Any]]] = {r.name: {} for r in reqs}
    violations: list[str] = []
    for spec in exp.networks:
        # a network's own collective (OptINC's in-network one, SiP-ML's ring) for every job
        mine = [dataclasses.replace(r, collective=spec.collective or r.collective)
                for r in reqs]
        stage1: Stage1
        if spec.kind == "oddl":
            b: Backend = registry.open_backend(backend, tb, grid, faults=exp.faults,
                                               seed=exp.seed, checker_mode=checker_mode,
                                               announce=announce)
            arbiter = Arbiter(tb, grid, b.onics, b.wss)
            arbiter.inventory()
            stage1 = OddlStage1(arbiter, spec)
        else:
            b = registry.open_model(spec, tb, list(grid.nodes), checker_mode, announce)
            stage1 = NoStage1()
        name = spec.name
        if store is not None:
            store.begin_network(name, spec.kind, {"spec": spec.model_dump(), "jobs": len(reqs),
                                                  "policy": exp.policy})
        profiler = registry.link_profiles(spec, list(grid.nodes), tb.optical.line_rate_gbps) \
            if spec.cassini else None
        adm = Admission(b, grid, mine, exp.policy, stage1, spec, tb, exp.name,
                        functools.partial(on_iteration, name), profiler)
        try:
            recs = adm.run()
        finally:
            b.close()
        b.monitor.finish(max((r.end_ns or 0) for r in recs.values()))
        for rec in recs.values():
            jobs[rec.name][name] = rec.public()
            if store is not None:
                store.set_job(name, rec.name, rec.arrival_ns, rec.start_ns, rec.end_ns,
                              list(rec.partition.nodes) if rec.partition else [])
        results[name] = _fabric_result(spec, adm, len(grid.nodes), b, stage1)
        if store is not None:
            res = results[name]
            store.set_outcome(name, res.disturbed, res.disturbance)
            store.add_faults(name, res.faults)
        violations += [f"{name}: {v}" for v in b.monitor.violations]
    return RunResult(exp.name, backend, results, None, len(violations),
                     time.perf_counter() - t_wall, 0, "compute per job (docs/multijob.md)",
                     total, total, violations=violations, jobs=jobs)


def _fabric_result(spec: NetworkSpec, adm: Admission, nodes: int, b: Backend,
                   stage1: Stage1) -> NetworkResult:
    """Per network: mean and p99 JCT, makespan (first arrival to last departure),
    utilisation (node-seconds held by jobs over the fabric's node-seconds); the faults
    and what they cost, and any disturbance (every attempt of every job, summed)."""
    recs = adm.records
    total = JobOutcome(0, 0, {}, [])
    for out in adm.outcomes:
        _add(total, out)
    dist = disturbance(total.stats)
    faults = [f.public() for f in fault_rows(
        b.injected, b.health.diagnoses if b.health is not None else [], adm.recoveries, True)]
    jcts = sorted(r.jct_s for r in recs.values())
    first = min(r.arrival_ns for r in recs.values())
    makespan = (max(r.end_ns or 0 for r in recs.values()) - first) / 1e9
    held = sum(r.node_ns() for r in recs.values()) / 1e9
    its = [t for r in recs.values() for t in r.iteration_ns]
    fabric = {
        "mean_jct_s": round(sum(jcts) / len(jcts), 9), "p99_jct_s": percentile(jcts, 99),
        "makespan_s": round(makespan, 9),
        "utilisation": round(held / (nodes * makespan), 6) if makespan else 0.0,
        "mean_queued_s": round(sum(r.queued_s for r in recs.values()) / len(recs), 9)}
    stats = {"plan_s": round(stage1.plan_s, 4)} if isinstance(stage1, OddlStage1) else {}
    return NetworkResult(spec.name, spec.kind, makespan, sum(its) / len(its) / 1e9 if its
                         else 0.0, len(its), sum(r.flows for r in recs.values()),
                         total.control_messages,
                         len(b.monitor.violations), stats, dist, bool(dist or faults), faults,
                         round(sum(r.t_resume_ns - r.t_last_ns for r in adm.recoveries) / 1e9,
                               9), fabric=fabric)


def run_experiment(ctx: LoadedExperiment, backend: str = "sim", store: RunStore | None = None,
                   iterations: int | None = None, progress: Progress | None = None,
                   checker_mode: str = "record", trace: Timeline | None = None,
                   announce: Announce | None = None) -> RunResult:
    if ctx.jobs:
        return run_jobs(ctx, backend, store, progress, checker_mode, announce)
    t_wall = time.perf_counter()
    exp, tb = ctx.experiment, ctx.testbed
    w = ctx.workload
    grid = Grid.from_testbed(tb)
    n = w.ranks or tb.n_nodes
    size = model_spec(w.model).grad_bytes(w.bytes_per_param)
    full = total_iterations(w, n)
    n_iter = iterations or exp.iterations or full
    by_name = {s.name: s for s in exp.networks}
    built: dict[tuple[str, int, bool], Schedule] = {}
    schedules: dict[str, Schedule] = {}
    for s in exp.networks:  # each network's collective (the workload's unless it names one)
        coll = s.collective or w.collective
        tot = coll == "totientrings"  # only TopoOpt's uses d
        key = (coll, s.degree if tot else 0, s.bidirectional and tot)
        if key not in built:
            built[key] = build(coll, n, size, tb.grid.rows, tb.grid.cols, s.degree,
                               s.bidirectional)
        schedules[s.name] = built[key]

    if w.calibrate is not None:
        cal = w.calibrate
        probe = NetworkRun(ctx, by_name[cal.network], grid, schedules[cal.network], backend,
                           "raise")
        t = probe.run(3, 0, None, None, False)
        comm_ns = sum(b - a for a, b in t) / len(t)
        per_iter = cal.training_time_min * 60e9 / full
        compute_ns = round(per_iter - comm_ns)
        if compute_ns < 0:
            raise RunFailed(f"calibration impossible: {cal.network} needs {comm_ns / 1e6:.3f} ms "
                            f"per iteration for communication alone, more than the "
                            f"{per_iter / 1e6:.3f} ms the target allows")
        calibration = (f"compute {compute_ns / 1e6:.4f} ms/iteration = {cal.training_time_min} min "
                       f"/ {full} iterations - {comm_ns / 1e6:.4f} ms {cal.network} "
                       f"communication (measured)")
    else:
        compute_ns = round((w.compute_time_ms or 0.0) * 1e6)
        calibration = f"compute {w.compute_time_ms} ms/iteration (given)"

    results: dict[str, NetworkResult] = {}
    violations: list[str] = []
    for spec in exp.networks:
        run = NetworkRun(ctx, spec, grid, schedules[spec.name], backend, checker_mode,
                         announce)
        if store is not None:
            rate = spec.link_gbps or tb.optical.line_rate_gbps
            meta: dict[str, Any] = {"spec": spec.model_dump(), "compute_ns": compute_ns,
                                    "wire_ns": wire_ns(schedules[spec.name], rate)}
            if run.plan is not None:
                meta["plan_summary"] = run.plan.summary_lines(max_wss=2, max_nodes=4)
            store.begin_network(spec.name, spec.kind, meta)
        times = run.run(n_iter, compute_ns, store, progress, exp.flow_records == "all", trace)
        its = [b - a for a, b in times]
        # iterations are identical in length when nothing perturbs them; extrapolate only
        # when the caller asked for fewer iterations than the workload has
        scale = full / len(its)
        out = run.outcome
        assert out is not None
        stats = run.stats()
        dist = disturbance(stats)
        faults = [f.public() for f in run.faults(completed=True)]
        disturbed = sum(dist.values()) > exp.disturbance_threshold * max(out.control_messages, 1)
        fault_s = sum(r.t_resume_ns - r.t_last_ns for r in run.recoveries) / 1e9
        results[spec.name] = NetworkResult(
            spec.name, spec.kind, sum(its) * scale / 1e9 + fault_s, sum(its) / len(its) / 1e9,
            len(its), out.flows, out.control_messages, len(run.monitor.violations), stats,
            dist, disturbed, faults, round(fault_s, 9))
        if store is not None:
            store.set_outcome(spec.name, disturbed, dist)
            store.add_faults(spec.name, faults)
        violations += [f"{spec.name}: {v}" for v in run.monitor.violations]

    oddl = next((r for r in results.values() if r.kind == "oddl"), None)
    el = next((r for r in results.values() if r.kind == "electrical"), None)
    ratio = oddl.training_time_s / el.training_time_s if oddl and el else None
    return RunResult(exp.name, backend, results, ratio, len(violations),
                     time.perf_counter() - t_wall, compute_ns, calibration, n_iter, full,
                     violations=violations)
