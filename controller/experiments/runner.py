"""The experiment runner: every network of an experiment on the same jobs.

For each network it opens a back end through the registry (closed again whatever happens),
hands the jobs to the one orchestration (controller/service/admission.py: a single workload is a
one-job admission), records every iteration as it completes, and builds the network's
result in one place. It does not know which back end it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from oddl.controller import registry
from oddl.controller.base.config import ConfigError, ConfigIssue, LoadedExperiment, NetworkSpec
from oddl.controller.base.topology import Grid
from oddl.controller.experiments.figures import wire_ns
from oddl.controller.experiments.remote import ArbiterClient
from oddl.controller.experiments.results import RunStore
from oddl.controller.service.admission import (
    Admission,
    JobRecord,
    JobRequest,
    NoStage1,
    OddlStage1,
    OnJob,
    Placer,
    Rectangles,
    Stage1,
    WholeTestbed,
    percentile,
)
from oddl.controller.service.backend import (
    Announce,
    Backend,
    Iteration,
    JobOutcome,
    RunFailed,
    disturbance,
)
from oddl.controller.service.recovery import fault_rows
from oddl.controller.stage1.arbiter import Arbiter
from oddl.controller.stage1.placement import fits
from oddl.controller.stage2.job import built_schedule, job_id
from oddl.controller.stage2.trace import Timeline
from oddl.controller.stage2.workloads import model_spec, total_iterations

__all__ = ["Network", "NetworkResult", "RunFailed", "RunResult", "Timeline", "lone_network",
           "run_experiment"]


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

    def summary(self, reference: dict[str, Any]) -> dict[str, Any]:
        """summary.json: the JSON object, how compute was found, the iterations run and
        the workload's, every network's stats, the first violations, the paper's figures."""
        return {**self.to_json_obj(), "compute_ns": self.compute_ns,
                "calibration": self.calibration, "iterations_simulated": self.iterations,
                "iterations_total": self.total_iterations,
                "stats": {n: r.stats for n, r in self.networks.items()},
                "violations": self.violations[:50], "reference": reference}

    def training_min(self) -> dict[str, float]:
        return {n: r.training_time_s / 60 for n, r in self.networks.items()}


Progress = Callable[[str, int, int], None]  # network, done, total


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
class Network:
    """One network's run: its back end, its stage 1, the orchestration of its jobs."""

    spec: NetworkSpec
    backend: Backend
    stage1: Stage1
    admission: Admission


@contextlib.contextmanager
def network(ctx: LoadedExperiment, spec: NetworkSpec, grid: Grid, requests: list[JobRequest],
            backend: str, checker_mode: str, run_name: str, *,
            announce: Announce | None = None, on_iteration: OnJob | None = None,
            trace: Timeline | None = None, record_flows: bool = False) -> Iterator[Network]:
    """A network ready to run its jobs: its back end open (and closed on the way out,
    whatever raised), stage 1's inventory taken (ODDL), the orchestration set up."""
    tb, exp = ctx.testbed, ctx.experiment
    # a network's own collective (OptINC's in-network one, SiP-ML's ring) for every job
    mine = [dataclasses.replace(r, collective=spec.collective or r.collective)
            for r in requests]
    b: Backend = registry.open_backend(backend, tb, grid, faults=exp.faults, seed=exp.seed,
                                       checker_mode=checker_mode, announce=announce) \
        if spec.kind == "oddl" else \
        registry.open_model(spec, tb, list(grid.nodes), checker_mode, announce)
    try:
        stage1: Stage1 = NoStage1()
        if spec.kind == "oddl":  # stage 1 on the testbed's devices, whichever back end
            arbiter = Arbiter(tb, grid, b.onics, b.wss)
            arbiter.inventory()
            stage1 = OddlStage1(arbiter, spec)
            gc.collect()  # time the planner, not a collection of an earlier run's garbage
        placer: Placer = Rectangles(grid, exp.policy) if ctx.jobs else \
            WholeTestbed(grid, exp.recovery)
        profiler = registry.link_profiles(spec, list(grid.nodes), tb.optical.line_rate_gbps) \
            if spec.cassini else None
        adm = Admission(b, grid, mine, placer, stage1, spec, tb, run_name, exp.name, on_iteration,
                        profiler, trace, record_flows)
        yield Network(spec, b, stage1, adm)
    finally:
        b.close()


def _lone_job(ctx: LoadedExperiment, iterations: int, compute_ns: int) -> JobRequest:
    """An experiment's one workload as the job it is: the whole testbed's."""
    w, tb = ctx.workload, ctx.testbed
    return JobRequest(w.model, w.model, w.collective, w.ranks or tb.n_nodes, iterations,
                      compute_ns, 0, "any", model_spec(w.model).grad_bytes(w.bytes_per_param))


def _calibrate(ctx: LoadedExperiment, backend: str, grid: Grid, full: int,
               run_name: str) -> tuple[int, str]:
    """Compute per iteration (ns), and how it was found: given, or fitted so that the
    calibration network's training takes the target time (its communication measured
    over 3 iterations with no compute)."""
    w = ctx.workload
    if w.calibrate is None:
        return round((w.compute_time_ms or 0.0) * 1e6), \
            f"compute {w.compute_time_ms} ms/iteration (given)"
    cal = w.calibrate
    spec = next(s for s in ctx.experiment.networks if s.name == cal.network)
    with network(ctx, spec, grid, [_lone_job(ctx, 3, 0)], backend, "raise",
                 f"{run_name}-calibration") as net:
        recs = net.admission.run()
    its = recs[ctx.workload.model].iteration_ns
    comm_ns = sum(its) / len(its)
    per_iter = cal.training_time_min * 60e9 / full
    compute_ns = round(per_iter - comm_ns)
    if compute_ns < 0:
        raise RunFailed(f"calibration impossible: {cal.network} needs {comm_ns / 1e6:.3f} ms "
                        f"per iteration for communication alone, more than the "
                        f"{per_iter / 1e6:.3f} ms the target allows")
    return compute_ns, (f"compute {compute_ns / 1e6:.4f} ms/iteration = "
                        f"{cal.training_time_min} min / {full} iterations - "
                        f"{comm_ns / 1e6:.4f} ms {cal.network} communication (measured)")


@contextlib.contextmanager
def lone_network(ctx: LoadedExperiment, name: str, iterations: int, compute_ns: int,
                 backend: str = "sim", checker_mode: str = "raise") -> Iterator[Network]:
    """One network of a one-workload experiment, ready to run `iterations` of its job
    (benchmarks: `net.admission.run()`, then `net.admission.outcomes`)."""
    spec = next((s for s in ctx.experiment.networks if s.name == name), None)
    if spec is None:
        raise ValueError(f"{ctx.experiment.name} has no network {name!r}")
    with network(ctx, spec, Grid.from_testbed(ctx.testbed),
                 [_lone_job(ctx, iterations, compute_ns)], backend, checker_mode,
                 job_id(ctx.experiment.name, os.getpid(), time.time_ns())) as net:
        yield net


def _remote_result(spec: NetworkSpec, job: dict[str, Any], its: list[list[int]], full: int
                   ) -> NetworkResult:
    """The arbiter's job as the network's result (its iterations, extrapolated to the
    workload's as a run of one job is)."""
    ns = [t1 - t0 for _i, t0, t1 in its]
    r = job["result"]
    return NetworkResult(spec.name, spec.kind, sum(ns) * full / len(ns) / 1e9,
                         sum(ns) / len(ns) / 1e9, len(ns), r["flows"], r["control_messages"],
                         0, {"arbiter_job": job["job"], "partition": job["partition"],
                             "stops": len(r.get("stops", []))})


def network_result(net: Network, threshold: float, extrapolate_to: int | None) -> NetworkResult:
    """A network's figures, from every attempt of every job: iterations, flows, messages,
    the faults and what they cost, and the disturbance (`disturbed`: more of it than
    `threshold` a control message). One job (`extrapolate_to`: the workload's iterations):
    its training time, extrapolated from the iterations run. Several: the time from the
    first arrival to the last departure, and per network mean and p99 JCT, makespan,
    utilisation (node-seconds held by jobs over the fabric's) and queueing."""
    adm, b = net.admission, net.backend
    recs = adm.records
    total = JobOutcome(0, 0, {}, [])
    for out in adm.outcomes:
        _add(total, out)
    stats = {**total.stats} | ({"plan_s": round(net.stage1.plan_s, 4)}
                                if isinstance(net.stage1, OddlStage1) else {})
    dist = disturbance(stats)
    faults = [f.public() for f in fault_rows(b.injected, b.health.diagnoses, adm.recoveries,
                                             True)]
    fault_s = sum(r.t_resume_ns - r.t_last_ns for r in adm.recoveries) / 1e9
    its = [t for r in recs.values() for t in r.iteration_ns]
    first = min(r.arrival_ns for r in recs.values())
    makespan = (max(r.end_ns or 0 for r in recs.values()) - first) / 1e9
    fabric: dict[str, float] = {}
    if extrapolate_to is not None:
        # iterations are identical in length when nothing perturbs them; extrapolate only
        # when fewer were run than the workload has
        training_s = sum(its) * extrapolate_to / len(its) / 1e9 + fault_s
    else:
        training_s = makespan
        jcts = sorted(r.jct_s for r in recs.values())
        held = sum(r.node_ns() for r in recs.values()) / 1e9
        nodes = len(net.admission.grid.nodes)
        fabric = {
            "mean_jct_s": round(sum(jcts) / len(jcts), 9), "p99_jct_s": percentile(jcts, 99),
            "makespan_s": round(makespan, 9),
            "utilisation": round(held / (nodes * makespan), 6) if makespan else 0.0,
            "mean_queued_s": round(sum(r.queued_s for r in recs.values()) / len(recs), 9)}
    disturbed = sum(dist.values()) > threshold * max(total.control_messages, 1)
    return NetworkResult(net.spec.name, net.spec.kind, training_s,
                         sum(its) / len(its) / 1e9 if its else 0.0, len(its),
                         sum(r.flows for r in recs.values()), total.control_messages,
                         len(b.monitor.violations), stats, dist, disturbed, faults,
                         round(fault_s, 9), fabric=fabric)


def run_experiment(ctx: LoadedExperiment, backend: str = "sim", store: RunStore | None = None,
                   iterations: int | None = None, progress: Progress | None = None,
                   checker_mode: str = "record", trace: Timeline | None = None,
                   announce: Announce | None = None, remote: ArbiterClient | None = None
                   ) -> RunResult:
    """Run every network of an experiment on the same jobs: its one workload (a job on the
    whole testbed, `iterations` of it, the training time extrapolated), or its several
    jobs (docs/multijob.md: each placed, planned and admitted as it arrives). `remote`:
    the testbed's arbiter runs the ODDL network's job (experiments/remote.py)."""
    t_wall = time.perf_counter()
    exp, tb = ctx.experiment, ctx.testbed
    grid = Grid.from_testbed(tb)
    run_name = job_id(exp.name, os.getpid(), time.time_ns())
    if remote is not None and ctx.jobs:
        raise RunFailed("an arbiter takes experiments of one workload: submit each job "
                        "(`oddl submit`)")
    if ctx.jobs:
        reqs = [JobRequest.of(e) for e in ctx.jobs]
        issues = [ConfigIssue(str(ctx.path), f"job {r.name!r}.shape",
                              f"no {r.shape} rectangle of {tb.grid.rows} x {tb.grid.cols} "
                              f"holds {r.ranks} ranks{' exactly (hier2d)' if r.exact else ''}")
                  for r in reqs if not fits(grid, r.ranks, r.shape, r.exact)]
        if issues:
            raise ConfigError(issues)
        full = n_iter = sum(r.iterations for r in reqs)
        compute_ns, calibration = 0, "compute per job (docs/multijob.md)"
    else:
        w = ctx.workload
        full = total_iterations(w, w.ranks or tb.n_nodes)
        n_iter = iterations or exp.iterations or full
        compute_ns, calibration = _calibrate(ctx, backend, grid, full, run_name)
        reqs = [_lone_job(ctx, n_iter, compute_ns)]
    done = dict.fromkeys((s.name for s in exp.networks), 0)

    def on_iteration(network: str, rec: JobRecord, it: Iteration) -> None:
        done[network] += 1
        if store is not None and ctx.jobs:
            store.add_job_iteration(network, rec.name, it.iteration, it.t_start, it.t_end)
        elif store is not None:
            store.add_iteration(network, it.iteration, it.t_start, it.t_end, compute_ns,
                                it.control_messages, it.flows)
        if progress is not None:
            progress(network, done[network], n_iter)

    results: dict[str, NetworkResult] = {}
    jobs: dict[str, dict[str, dict[str, Any]]] = {r.name: {} for r in reqs} if ctx.jobs else {}
    violations: list[str] = []
    for spec in exp.networks:
        name = spec.name
        meta: dict[str, Any] = {"spec": spec.model_dump()}
        if ctx.jobs:
            meta |= {"jobs": len(reqs), "policy": exp.policy}
        else:
            # the schedule the admission plans (built once: built_schedule keeps it)
            sched = built_schedule(spec.collective or reqs[0].collective, reqs[0].ranks,
                                   reqs[0].size, tb.grid.rows, tb.grid.cols, spec.degree,
                                   spec.bidirectional)
            meta |= {"compute_ns": compute_ns,
                     "wire_ns": wire_ns(sched, spec.link_gbps or tb.optical.line_rate_gbps)}
        if store is not None:
            store.begin_network(name, spec.kind, meta)
        if remote is not None and spec.kind == "oddl":
            job, its = remote.run(ctx.path, name, compute_ns, store, progress)
            results[name] = _remote_result(spec, job, its, full)
            continue
        with network(ctx, spec, grid, reqs, backend, checker_mode, run_name,
                     announce=announce, on_iteration=functools.partial(on_iteration, name),
                     trace=trace, record_flows=exp.flow_records == "all") as net:
            recs = net.admission.run()
        # closed: a drill's faults still in force are ended and counted
        net.backend.monitor.finish(max((r.end_ns or 0) for r in recs.values())
                                   + net.admission.t0)
        res = results[name] = network_result(net, exp.disturbance_threshold,
                                             None if ctx.jobs else full)
        plan = next(iter(recs.values())).plan
        if store is not None:
            if plan is not None and not ctx.jobs:
                store.begin_network(name, spec.kind, meta | {
                    "plan_summary": plan.summary_lines(max_wss=2, max_nodes=4)})
            for rec in recs.values() if ctx.jobs else ():
                store.set_job(name, rec.name, rec.arrival_ns, rec.start_ns, rec.end_ns,
                              list(rec.partition.nodes) if rec.partition else [])
            store.set_outcome(name, res.disturbed, res.disturbance)
            store.add_faults(name, res.faults)
        for rec in recs.values() if ctx.jobs else ():
            jobs[rec.name][name] = rec.public()
        violations += [f"{name}: {v}" for v in net.backend.monitor.violations]

    oddl = next((r for r in results.values() if r.kind == "oddl"), None)
    el = next((r for r in results.values() if r.kind == "electrical"), None)
    ratio = oddl.training_time_s / el.training_time_s if oddl and el and not ctx.jobs else None
    return RunResult(exp.name, backend, results, ratio, len(violations),
                     time.perf_counter() - t_wall, compute_ns, calibration, n_iter, full,
                     violations=violations, jobs=jobs)
