"""The experiment runner: one workload, several networks, the same job runner for each.

For each network it asks the registry for a back end, runs stage 1 (inventory, plan,
apply, read back) where the network has one, hands the job to the back end and records
every iteration as it completes. It does not know which back end it has.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
from oddl.controller import registry
from oddl.controller.arbiter import Arbiter
from oddl.controller.backend import Iteration, JobOutcome, RunFailed, disturbance
from oddl.controller.collectives import Schedule, build
from oddl.controller.config import LoadedExperiment, NetworkSpec
from oddl.controller.invariants import InvariantChecker
from oddl.controller.job import JOB_VERSION, JobSpec, job_id, timing_of, wire_routes
from oddl.controller.plan import Plan
from oddl.controller.results import RunStore
from oddl.controller.topology import Grid
from oddl.controller.workloads import model_spec, total_iterations
from oddl.fpga.countaction import step_sync
from oddl.fpga.regmap import N_MODULES

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

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("name", "kind", "stats")}


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

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "backend": self.backend,
            "networks": {n: r.public() for n, r in self.networks.items()},
            "ratio": self.ratio,
            "invariant_violations": self.invariant_violations,
            "wall_s": round(self.wall_s, 3),
        }


Progress = Callable[[str, int, int], None]  # network, done, total


class NetworkRun:
    """One network of an experiment: its back end, stage 1 where it has one, its job."""

    def __init__(self, ctx: LoadedExperiment, spec: NetworkSpec, grid: Grid,
                 schedule: Schedule, backend: str, checker_mode: str) -> None:
        tb, exp, w = ctx.testbed, ctx.experiment, ctx.experiment.workload
        self.spec = spec
        ranks = list(grid.nodes[: len(schedule)])
        self.plan: Plan | None = None
        self.plan_s = 0.0
        nic_sync = False
        routes: dict[str, dict[str, tuple[str, int, str]]] = {}
        if spec.kind == "oddl":  # stage 1 on the testbed's devices, whichever back end
            self.backend = registry.open_backend(backend, tb, grid, faults=exp.faults,
                                                 seed=exp.seed, checker_mode=checker_mode)
            arb = Arbiter(tb, grid, self.backend.onics, self.backend.wss)
            arb.inventory()
            gc.collect()  # time the planner, not a collection of an earlier run's garbage
            t_plan = time.perf_counter()
            self.plan = arb.plan(schedule, spec.strategy)
            self.plan_s = time.perf_counter() - t_plan
            # step synchronisation runs on the O-NICs' count-action engines when the
            # schedule fits them; otherwise the host counts deliveries
            nic_sync = all(0 < len(s) <= N_MODULES and all(x.recv_bytes > 0 for x in s)
                           for s in schedule)
            programs = ({n: step_sync([x.recv_bytes for x in schedule[r]])
                         for r, n in enumerate(ranks)} if nic_sync else None)
            arb.apply(self.plan, programs)
            routes = wire_routes(self.plan)
        else:  # a baseline: a flow-level model in every back end
            self.backend = registry.open_model(spec, tb, ranks, checker_mode)
        self.job = JobSpec(
            JOB_VERSION, job_id(exp.name, spec.name, os.getpid(), time.time_ns()),
            spec.collective or w.collective, model_spec(w.model).grad_bytes(w.bytes_per_param),
            tb.grid.rows, tb.grid.cols, spec.degree, ranks, list(grid.nodes), 0, 0, nic_sync,
            timing_of(tb), routes)
        self.outcome: JobOutcome | None = None

    @property
    def monitor(self) -> InvariantChecker:
        return self.backend.monitor

    def run(self, n_iter: int, compute_ns: int, store: RunStore | None,
            progress: Progress | None, record_flows: bool) -> list[tuple[int, int]]:
        """Run the job; record every iteration as it completes (a killed run keeps them)."""
        name = self.spec.name
        job = msgspec.structs.replace(self.job, iterations=n_iter, compute_ns=compute_ns)
        times: list[tuple[int, int]] = []

        def on_iteration(it: Iteration) -> None:
            times.append((it.t_start, it.t_end))
            if store is not None:
                store.add_iteration(name, it.iteration, it.t_start, it.t_end, compute_ns,
                                    it.control_messages, it.flows)
            if progress is not None:
                progress(name, it.iteration + 1, n_iter)

        b = self.backend
        try:
            self.outcome = b.loop.run_until_complete(b.run_job(job, on_iteration,
                                                               record_flows))
        except RuntimeError as e:
            if "deadlock" not in str(e):
                raise
            missing = self.monitor.undelivered()
            raise RunFailed(f"{name}: the run stalled with nothing left to do; "
                            f"{len(missing)} flows undelivered, e.g. ids {missing[:5]}") from e
        finally:
            b.close()
        self.monitor.finish(times[-1][1] if times else 0)
        return times

    def stats(self) -> dict[str, Any]:
        assert self.outcome is not None
        extra = {"plan_s": round(self.plan_s, 4)} if self.plan is not None else {}
        return {**self.outcome.stats, **extra}


def run_experiment(ctx: LoadedExperiment, backend: str = "sim", store: RunStore | None = None,
                   iterations: int | None = None, progress: Progress | None = None,
                   checker_mode: str = "record") -> RunResult:
    t_wall = time.perf_counter()
    exp, tb = ctx.experiment, ctx.testbed
    w = exp.workload
    grid = Grid.from_testbed(tb)
    n = tb.n_nodes
    size = model_spec(w.model).grad_bytes(w.bytes_per_param)
    full = total_iterations(w, n)
    n_iter = iterations or exp.iterations or full
    by_name = {s.name: s for s in exp.networks}
    built: dict[tuple[str, int], Schedule] = {}
    schedules: dict[str, Schedule] = {}
    for s in exp.networks:  # each network's collective (the workload's unless it names one)
        coll = s.collective or w.collective
        key = (coll, s.degree if coll == "totientrings" else 0)  # only TopoOpt's uses d
        if key not in built:
            built[key] = build(coll, n, size, tb.grid.rows, tb.grid.cols, s.degree)
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
        run = NetworkRun(ctx, spec, grid, schedules[spec.name], backend, checker_mode)
        if store is not None:
            meta: dict[str, Any] = {"spec": spec.model_dump(), "compute_ns": compute_ns}
            if run.plan is not None:
                meta["plan_summary"] = run.plan.summary_lines(max_wss=2, max_nodes=4)
            store.begin_network(spec.name, spec.kind, meta)
        times = run.run(n_iter, compute_ns, store, progress, exp.flow_records == "all")
        its = [b - a for a, b in times]
        # iterations are identical in length when nothing perturbs them; extrapolate only
        # when the caller asked for fewer iterations than the workload has
        scale = full / len(its)
        out = run.outcome
        assert out is not None
        stats = run.stats()
        dist = disturbance(stats)
        disturbed = sum(dist.values()) > exp.disturbance_threshold * max(out.control_messages, 1)
        results[spec.name] = NetworkResult(
            spec.name, spec.kind, sum(its) * scale / 1e9, sum(its) / len(its) / 1e9, len(its),
            out.flows, out.control_messages, len(run.monitor.violations), stats, dist,
            disturbed)
        if store is not None:
            store.set_outcome(spec.name, disturbed, dist)
        violations += [f"{spec.name}: {v}" for v in run.monitor.violations]

    oddl = next((r for r in results.values() if r.kind == "oddl"), None)
    el = next((r for r in results.values() if r.kind == "electrical"), None)
    ratio = oddl.training_time_s / el.training_time_s if oddl and el else None
    return RunResult(exp.name, backend, results, ratio, len(violations),
                     time.perf_counter() - t_wall, compute_ns, calibration, n_iter, full,
                     violations=violations)
