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
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

from oddl.app import collector, registry
from oddl.app.experiments.estimate import estimate, network_seconds, refuse_if_too_big
from oddl.app.experiments.figures import wire_ns
from oddl.app.experiments.outcome import NetworkResult, RunResult, add_attempt
from oddl.app.experiments.remote import ArbiterClient
from oddl.app.experiments.results import RunStore
from oddl.controller.base.accelerators import ACCELERATORS
from oddl.controller.base.config import ConfigError, ConfigIssue, LoadedExperiment, NetworkSpec
from oddl.controller.base.ddp import Overlap
from oddl.controller.base.topology import Grid
from oddl.controller.service.admission import Admission, OnJob
from oddl.controller.service.backend import (
    Announce,
    Backend,
    Iteration,
    JobOutcome,
    RunFailed,
    disturbance,
    disturbed,
    host_disturbance_ms,
)
from oddl.controller.service.jobs import JobRecord, JobRequest, percentile
from oddl.controller.service.placing import Placer, Rectangles, WholeTestbed
from oddl.controller.service.recovery import fault_rows
from oddl.controller.service.stages import NoStage1, OddlStage1, Stage1
from oddl.controller.serving.lifecycle import SIGNALS, deaf, sigint_ignored
from oddl.controller.stage1.arbiter import Arbiter
from oddl.controller.stage1.placement import fits
from oddl.controller.stage2.job import built_schedule, job_id
from oddl.controller.stage2.trace import Timeline
from oddl.controller.stage2.workloads import model_spec, total_iterations

log = logging.getLogger(__name__)

__all__ = ["Network", "NetworkResult", "RunFailed", "RunResult", "Timeline", "lone_network",
           "run_experiment"]


Progress = Callable[[str, int, int], None]  # network, done, total


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
            trace: Timeline | None = None, record_flows: bool = False,
            extend: bool = False) -> Iterator[Network]:
    """A network ready to run its jobs: its back end open (and closed on the way out,
    whatever raised), stage 1's inventory taken (ODDL), the orchestration set up.
    `extend`: a run's one job may end in copies of its repeated iteration (sim/steady.py)."""
    tb, exp = ctx.testbed, ctx.experiment
    # a network's own collective (OptINC's in-network one, SiP-ML's ring) for every job
    mine = [dataclasses.replace(r, collective=spec.collective or r.collective)
            for r in requests]
    with collector.tuned():
        b: Backend = registry.open_backend(
            backend, tb, grid, faults=exp.faults, seed=exp.seed, checker_mode=checker_mode,
            announce=announce) if spec.kind == "oddl" else \
            registry.open_model(spec, tb, list(grid.nodes), checker_mode, announce)
        try:
            stage1: Stage1 = NoStage1()
            if spec.kind == "oddl":  # stage 1 on the testbed's devices, whichever back end
                arbiter = Arbiter(tb, grid, b.onics, b.wss, b.fan_out)
                arbiter.inventory()
                stage1 = OddlStage1(arbiter, spec)
            # what is set up lives as long as the run: out of the collector's sight, and
            # the planner timed without an earlier run's garbage
            gc.collect()
            gc.freeze()
            placer: Placer = Rectangles(grid, exp.policy) if ctx.jobs else \
                WholeTestbed(grid, exp.recovery)
            profiler = registry.link_profiles(spec, list(grid.nodes),
                                              tb.optical.line_rate_gbps) \
                if spec.cassini else None
            adm = Admission(b, grid, mine, placer, stage1, spec, tb, run_name, exp.name,
                            on_iteration, profiler, trace, record_flows, extend=extend)
            yield Network(spec, b, stage1, adm)
        finally:
            b.close()


def _lone_job(ctx: LoadedExperiment, iterations: int, compute_ns: int,
              overlap: bool = True) -> JobRequest:
    """An experiment's one workload as the job it is: the whole testbed's (`overlap`
    False: its compute, then its all-reduce, whatever the workload says)."""
    w, tb = ctx.workload, ctx.testbed
    if ctx.recorded is not None:  # a recorded step: its own compute and collectives
        ov: Overlap | None = ctx.recorded.overlap
    else:
        ov = w.ddp(w.label, w.batch_per_node or 0, w.bytes_per_param, compute_ns) \
            if overlap else None
    return JobRequest(w.label, w.label, w.collective, w.ranks or tb.n_nodes, iterations,
                      compute_ns, 0, "any", model_spec(w.label).grad_bytes(w.bytes_per_param)
                      if ov is None else ov.nbytes,
                      hybrid=w.parallelism.hybrid(w.label, w.bytes_per_param)
                      if w.parallelism else None, overlap=ov)


def _iteration_ns(ctx: LoadedExperiment, backend: str, grid: Grid, run_name: str,
                  req: JobRequest) -> float:
    """The mean iteration of `req` over its iterations on the calibration network."""
    cal = ctx.workload.calibrate
    assert cal is not None
    spec = next(s for s in ctx.experiment.networks if s.name == cal.network)
    with network(ctx, spec, grid, [req], backend, "raise", f"{run_name}-calibration") as net:
        recs = net.admission.run()
    its = recs[ctx.workload.label].iteration_ns
    return sum(its) / len(its)


MAX_CALIBRATION_ROUNDS = 12


def _calibrate(ctx: LoadedExperiment, backend: str, grid: Grid, full: int,
               run_name: str) -> tuple[int, str]:
    """Compute per iteration (ns), and how it was found: given, or fitted so that the
    calibration network's training takes the target time (its communication measured
    over 3 iterations with no compute)."""
    w = ctx.workload
    rec = ctx.recorded
    if rec is not None:
        ov = rec.overlap
        return ov.compute_ns, (
            f"compute from {rec.path} ({rec.step}, {rec.backend}, {rec.world_size} ranks, "
            f"{rec.step_ns / 1e6:.3f} ms as recorded): forward {ov.forward_ns / 1e6:.3f} ms, "
            f"backward to {ov.compute_ns / 1e6:.3f} ms, optimiser "
            f"{ov.optimizer_ns / 1e6:.3f} ms; {len(rec.collectives)} collectives on "
            f"{rec.streams} stream(s), run in launch order")
    if w.parallelism is not None:
        return 0, (f"compute from {w.model}'s FLOPs at {w.parallelism.gpu_tflops} TFLOP/s, "
                   f"between the transfers (docs/model.md)")
    if w.device is not None:
        ns = w.device_compute_ns(w.label, w.batch_per_node or 0) or 0
        return ns, (f"compute {ns / 1e6:.4f} ms/iteration: {w.model}'s layer table, "
                    f"{w.batch_per_node} samples at the {w.device}'s sustained "
                    f"{ACCELERATORS[w.device].flops_per_s / 1e12:.1f} TFLOP/s (docs/model.md)")
    if w.calibrate is None:
        return round((w.compute_time_ms or 0.0) * 1e6), \
            f"compute {w.compute_time_ms} ms/iteration (given)"
    cal = w.calibrate
    comm_ns = _iteration_ns(ctx, backend, grid, run_name, _lone_job(ctx, 3, 0, False))
    per_iter = cal.training_time_min * 60e9 / full
    compute_ns = round(per_iter - comm_ns)
    if compute_ns < 0:
        raise RunFailed(f"calibration impossible: {cal.network} needs {comm_ns / 1e6:.3f} ms "
                        f"per iteration for communication alone, more than the "
                        f"{per_iter / 1e6:.3f} ms the target allows")
    how = (f"compute {compute_ns / 1e6:.4f} ms/iteration = {cal.training_time_min} min / "
           f"{full} iterations - {comm_ns / 1e6:.4f} ms {cal.network} communication "
           f"(measured)")
    if not w.overlap:
        return compute_ns, how
    # overlapped, only the part of the all-reduce backward does not hide is paid: the
    # compute whose iteration takes the target's, found by fixed point (what is exposed
    # shrinks as compute grows, so it settles in a few 3-iteration runs)
    settled = ""
    for k in range(MAX_CALIBRATION_ROUNDS):
        it = _iteration_ns(ctx, backend, grid, run_name, _lone_job(ctx, 3, compute_ns))
        exposed = it - compute_ns
        step = round(per_iter - exposed) - compute_ns
        compute_ns += step
        if abs(step) <= 1:
            settled = f"settled in {k + 1} rounds"
            break
    return compute_ns, (f"compute {compute_ns / 1e6:.4f} ms/iteration: {cal.network} with "
                        f"DDP's buckets overlapping backward trains in "
                        f"{cal.training_time_min} min ({exposed / 1e6:.4f} ms an iteration "
                        f"exposed; {settled or f'NOT settled in {k + 1} rounds'}; without "
                        f"overlap, {how})")


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


def _remote_result(spec: NetworkSpec, job: dict[str, Any], its: list[list[int]], full: int,
                   threshold: float) -> NetworkResult:
    """The arbiter's job as the network's result (its iterations, extrapolated to the
    workload's as a run of one job is)."""
    ns = [t1 - t0 for _i, t0, t1 in its]
    r = job["result"]
    dist = {k: int(v) for k, v in r.get("disturbance", {}).items()}
    return NetworkResult(spec.name, spec.kind, sum(ns) * full / len(ns) / 1e9,
                         sum(ns) / len(ns) / 1e9, len(ns), r["flows"], r["control_messages"],
                         0, {"arbiter_job": job["job"], "partition": job["partition"],
                             "stops": len(r.get("stops", []))}, dist,
                         disturbed(dist, r["control_messages"], threshold))


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
        add_attempt(total, out)
    stats = {**total.stats} | ({"plan_s": round(net.stage1.plan_s, 4)}
                                if isinstance(net.stage1, OddlStage1) else {})
    dist = disturbance(stats)
    ended_ns = max(r.end_ns or 0 for r in recs.values())  # (from the jobs' start, t0)
    faults = [f.public() for f in fault_rows(b.injected, b.health.diagnoses, adm.recoveries,
                                             True, adm.t0 + ended_ns if ended_ns else None)]
    fault_s = sum(r.t_resume_ns - r.t_last_ns for r in adm.recoveries) / 1e9
    its = [t for r in recs.values() for t in r.iteration_ns]
    first = min(r.arrival_ns for r in recs.values())
    makespan = (ended_ns - first) / 1e9
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
    was_disturbed = disturbed(dist, total.control_messages, threshold)
    # a real-time back end on a loaded host: how late its loops ran (the controller's,
    # the node programs'), said beside the figures; where that skews them, disturbed
    lags = b.health.max_lag_ns
    if any(lags.values()):
        stats["loop_lag_ms"] = {k: round(v / 1e6, 3) for k, v in lags.items()}
        if lag_ms := host_disturbance_ms(lags, sum(its) / len(its) if its else 0):
            was_disturbed = True
            dist["host_lag_ms"] = lag_ms
    return NetworkResult(net.spec.name, net.spec.kind, training_s,
                         sum(its) / len(its) / 1e9 if its else 0.0, len(its),
                         sum(r.flows for r in recs.values()), total.control_messages,
                         len(b.monitor.violations), stats, dist, was_disturbed, faults,
                         round(fault_s, 9), fabric=fabric,
                         control_unit=stats.get("control_unit", {}), steady=total.extended)


# a job's copies of its repeated iteration (sim/steady.py) come all at once: committed,
# and their progress told, this many at a time (each commit: 80 us)
COPIES_AT_ONCE = 4096


class _Recorder:
    """Each completed iteration into the store (committed at once) and the progress."""

    def __init__(self, store: RunStore | None, several: bool, compute_ns: int,
                 progress: Progress | None, total: int) -> None:
        self.store, self.several, self.compute_ns = store, several, compute_ns
        self.progress, self.total = progress, total
        self.done: dict[str, int] = {}

    def __call__(self, network: str, rec: JobRecord, it: Iteration) -> None:
        n = self.done[network] = self.done.get(network, 0) + 1
        now = it.repeats is None or n % COPIES_AT_ONCE == 0 or it.iteration + 1 >= self.total
        if self.store is not None and self.several:
            self.store.add_job_iteration(network, rec.name, it.iteration, it.t_start,
                                         it.t_end)
        elif self.store is not None:
            self.store.add_iteration(network, it.iteration, it.t_start, it.t_end,
                                     self.compute_ns, it.control_messages, it.flows,
                                     commit=now, repeats=it.repeats)
        if self.progress is not None and now:
            self.progress(network, n, self.total)


def _meta(ctx: LoadedExperiment, spec: NetworkSpec, reqs: list[JobRequest],
          compute_ns: int) -> dict[str, Any]:
    """What the store says of a network before it runs."""
    meta: dict[str, Any] = {"spec": spec.model_dump()}
    if ctx.jobs:
        return meta | {"jobs": len(reqs), "policy": ctx.experiment.policy}
    # the schedule the admission plans (built once: built_schedule keeps it)
    r = reqs[0]
    sched = built_schedule(spec.collective or r.collective, r.ranks, r.size,
                           ctx.testbed.grid.rows, ctx.testbed.grid.cols, spec.degree,
                           spec.bidirectional, overlap=r.overlap)
    return meta | {"compute_ns": compute_ns,
                   "wire_ns": wire_ns(sched, spec.link_gbps
                                      or ctx.testbed.optical.line_rate_gbps)}


def _begin(ctx: LoadedExperiment, spec: NetworkSpec, reqs: list[JobRequest], compute_ns: int,
           store: RunStore | None) -> dict[str, Any]:
    meta = _meta(ctx, spec, reqs, compute_ns)
    if store is not None:
        store.begin_network(spec.name, spec.kind, meta)
    return meta


def run_network(ctx: LoadedExperiment, spec: NetworkSpec, reqs: list[JobRequest], backend: str,
                checker_mode: str, run_name: str, compute_ns: int, full: int,
                store: RunStore | None, on_iteration: OnJob | None,
                announce: Announce | None = None, trace: Timeline | None = None,
                extend: bool = False
                ) -> tuple[NetworkResult, list[str], dict[str, dict[str, Any]]]:
    """One network of an experiment, start to end: its result, the invariant violations
    it saw, and (several jobs) each job's figures on it."""
    name = spec.name
    meta = _begin(ctx, spec, reqs, compute_ns, store)
    with network(ctx, spec, Grid.from_testbed(ctx.testbed), reqs, backend, checker_mode,
                 run_name, announce=announce, on_iteration=on_iteration, trace=trace,
                 record_flows=ctx.experiment.flow_records == "all", extend=extend) as net:
        recs = net.admission.run()
    # closed: a drill's faults still in force are ended and counted
    net.backend.monitor.finish(max((r.end_ns or 0) for r in recs.values())
                               + net.admission.t0)
    res = network_result(net, ctx.experiment.disturbance_threshold,
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
    per_job = {rec.name: rec.public() for rec in recs.values()} if ctx.jobs else {}
    return res, [f"{name}: {v}" for v in net.backend.monitor.violations], per_job


def _aside_main(conn: Connection, ctx: LoadedExperiment, spec: NetworkSpec,
                reqs: list[JobRequest], checker_mode: str, run_name: str, compute_ns: int,
                full: int, store_path: Path | None, total: int, announcing: bool,
                extend: bool) -> None:
    """A worker process: one model network, its iterations into the run's store (a
    connection of its own), its progress and notes for the bus's watchers (`announcing`)
    relayed to the parent, then its result sent back."""
    deaf()  # the group's SIGINT and SIGTERM are the parent's to act on: it stops us
    store = RunStore(store_path) if store_path is not None else None
    try:
        def progress(network: str, done: int, of: int) -> None:
            conn.send(("progress", network, done, of))

        def announce(kind: str, payload: bytes) -> None:
            conn.send(("announce", kind, payload))
        rec = _Recorder(store, bool(ctx.jobs), compute_ns, progress, total)
        # a model network has no devices: the back end's name does not reach it
        out = run_network(ctx, spec, reqs, "sim", checker_mode, run_name, compute_ns, full,
                          store, functools.partial(rec, spec.name),
                          announce if announcing else None, extend=extend)
        conn.send(("result", spec.name, out))
    except (BrokenPipeError, EOFError, ConnectionResetError):
        pass  # the parent is gone (killed): what was done is in the store; end quietly
    except BaseException as e:  # whatever it is, the parent hears of it
        with contextlib.suppress(OSError):  # (unless it is gone meanwhile)
            conn.send(("error", spec.name, f"{type(e).__name__}: {e}",
                       traceback.format_exc()))
    finally:
        if store is not None:
            store.close()
        conn.close()


class _Aside:
    """The model networks of an experiment, run in worker processes (spawned: nothing of
    this process's state goes with them) while this one runs the ODDL networks. Their
    progress reaches `progress`, and their notes `announce` (both must take calls from
    another thread), from a thread that listens to them; `results` waits for them all,
    and fails with the first failure's message."""

    def __init__(self, ctx: LoadedExperiment, specs: list[NetworkSpec],
                 reqs: list[JobRequest], run_name: str, checker_mode: str, compute_ns: int,
                 full: int, store_path: Path | None, progress: Progress | None,
                 workers: int, total: int, announce: Announce | None = None,
                 extend: bool = False) -> None:
        mp = multiprocessing.get_context("spawn")
        self.progress, self.announce = progress, announce
        self.queue = list(specs)
        self.running: dict[str, tuple[BaseProcess, Connection]] = {}
        self.out: dict[str, tuple[NetworkResult, list[str], dict[str, dict[str, Any]]]] = {}
        self.failed: list[str] = []
        self._args = (ctx, reqs, checker_mode, run_name, compute_ns, full, store_path, total,
                      announce is not None, extend)
        self._mp, self._workers = mp, workers
        self._lock = threading.Lock()
        self._closing = False
        # the listener waits on the workers' pipes and this one, which wakes it to wait on
        # a worker started by another thread (`grow`)
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        # set by the listener as it returns (a Thread's is_alive() is not to be trusted
        # after a join that a signal interrupted: Python 3.11 then marks it stopped)
        self._done = threading.Event()
        self.started: dict[str, float] = {}  # network -> when its worker started (monotonic)
        self.ended: dict[str, float] = {}  # network -> when its worker was heard to end
        self._start_more()
        self._listener = threading.Thread(target=self._listen, name="oddl-aside",
                                          daemon=True)
        self._listener.start()

    def _start_more(self) -> None:
        with self._lock:
            while self.queue and len(self.running) < self._workers:
                spec = self.queue.pop(0)
                mine, theirs = self._mp.Pipe(duplex=False)
                ctx, reqs, *rest = self._args
                p = self._mp.Process(target=_aside_main, name=f"oddl-{spec.name}",
                                     args=(theirs, ctx, spec, reqs, *rest), daemon=True)
                # born deaf to a terminal's Ctrl-C and a supervisor's SIGTERM (they reach
                # the whole process group), and kept deaf (`deaf`): this process stops its
                # workers itself, on the way out
                with sigint_ignored(*SIGNALS):
                    p.start()
                theirs.close()
                self.running[spec.name] = (p, mine)
                self.started[spec.name] = time.monotonic()

    def grow(self) -> None:
        """One more worker: this process has run its own networks and only waits from now
        on, so its core takes the next model network (a run of model networks alone, as
        cassini-fattree, uses every core instead of all but one)."""
        with self._lock:
            self._workers += 1
        self._start_more()
        self._wake_w.send_bytes(b"")

    def _listen(self) -> None:
        try:
            self._relay()
        finally:
            self._done.set()

    def _relay(self) -> None:
        while True:
            with self._lock:
                conns = {c: n for n, (_p, c) in self.running.items()}
            if not conns:
                return
            for ready in multiprocessing.connection.wait([*conns, self._wake_r]):
                c = cast(Connection, ready)  # the pipes given, one of them
                if c is self._wake_r:  # a worker started elsewhere: wait on it too
                    c.recv_bytes()
                    continue
                name = conns[c]
                msg: tuple[Any, ...]
                try:
                    msg = c.recv()
                except EOFError:  # it died without a word (killed, out of memory)
                    msg = ("error", name, "the worker process died", "")
                if msg[0] == "progress":
                    if self.progress is not None:
                        self.progress(*msg[1:])
                    continue
                if msg[0] == "announce":
                    if self.announce is not None:
                        self.announce(*msg[1:])
                    continue
                if msg[0] == "result":
                    self.out[name] = msg[2]
                elif self._closing:  # stopped by us: no failure of its own
                    pass
                else:
                    log.error("network %s failed in its worker:\n%s", name, msg[3])
                    self.failed.append(f"network {name}: {msg[2]}")
                with self._lock:
                    p, conn = self.running.pop(name)
                self.ended[name] = time.monotonic()
                conn.close()
                p.join()
                self._start_more()

    def results(self) -> dict[str, tuple[NetworkResult, list[str],
                                         dict[str, dict[str, Any]]]]:
        self._done.wait()
        if self.failed:
            raise RunFailed("; ".join(self.failed))
        return self.out

    def close(self) -> None:
        """Whatever is still running (this process failed first) is stopped."""
        self.queue.clear()
        self._closing = True
        with self._lock:
            for p, _c in self.running.values():
                p.kill()  # (deaf to SIGTERM)
        if self._done.wait(timeout=10):
            self._wake_r.close()
            self._wake_w.close()


# the estimated seconds of a run's model networks from which they go to worker processes
# by default: a process costs about a second of a core to start (imports)
PARALLEL_FROM_S = 1.0


# the iterations a repeating job's model network is estimated at (it repeats from its 4th
# at the earliest, and its 9th's probe is the third pair's)
REPEATS_BY = 10


def _spare_cores() -> int:
    """Cores this process may use beyond its own (its affinity, not the machine's)."""
    return max(len(os.sched_getaffinity(0)) - 1, 0)


def _flows(ctx: LoadedExperiment, reqs: list[JobRequest]) -> int:
    """About the flows the run's jobs send (each network's own collective aside; a job
    whose schedule depends on where it lands, as hier2d's, counted as halving-doubling)."""
    rows, cols = ctx.testbed.grid.rows, ctx.testbed.grid.cols

    def per_iteration(r: JobRequest) -> int:
        try:
            sched = built_schedule(r.collective, r.ranks, r.size, rows, cols, 4, False,
                                   r.alltoall, overlap=r.overlap)
        except ValueError:
            sched = built_schedule("hd", r.ranks, r.size, rows, cols, 4, False, r.alltoall,
                                   overlap=r.overlap)
        return sum(len(st.sends) for steps in sched for st in steps)

    return sum(r.iterations * per_iteration(r) for r in reqs)


def model_networks(ctx: LoadedExperiment, reqs: list[JobRequest], flows: int
                   ) -> list[tuple[NetworkSpec, float]]:
    """The experiment's model networks and what each will take (estimate.py) for `reqs`
    (`flows` in all), the longest first: workers take them in this order, so the last to
    start is a short one and the cores end together. A congestion law costs its ticks, not
    its flows."""
    est = [(s, network_seconds(ctx, s, reqs, flows)[0]) for s in ctx.experiment.networks
           if s.kind != "oddl"]
    return sorted(est, key=lambda sc: -sc[1])


def run_experiment(ctx: LoadedExperiment, backend: str = "sim", store: RunStore | None = None,
                   iterations: int | None = None, progress: Progress | None = None,
                   checker_mode: str = "record", trace: Timeline | None = None,
                   announce: Announce | None = None, remote: ArbiterClient | None = None,
                   workers: int | None = 0, force: bool = False,
                   every_iteration: bool = False) -> RunResult:
    """Run every network of an experiment on the same jobs: its one workload (a job on the
    whole testbed, `iterations` of it, the training time extrapolated), or its several
    jobs (docs/multijob.md: each placed, planned and admitted as it arrives). `remote`:
    the testbed's arbiter runs the ODDL network's job (app/experiments/remote.py).
    `workers`: run the model networks (the baselines) in up to that many processes
    beside this one, which runs the ODDL networks (0: all here, one after another; None:
    one per spare core when the run is long enough to pay for starting them). A run that
    would take hours, or more memory than is free, is refused up front (estimate.py)
    unless `force`. A job that repeats its iteration ends in copies of it
    (sim/steady.py), unless `every_iteration`."""
    t_wall = time.perf_counter()
    exp, tb = ctx.experiment, ctx.testbed
    grid = Grid.from_testbed(tb)
    # (a cassette's, replaying: the job ids the node programs were sent)
    run_name = registry.recorded("run name", lambda: job_id(exp.name, os.getpid(),
                                                            time.time_ns()))
    if remote is not None and ctx.jobs:
        raise RunFailed("an arbiter takes experiments of one workload: submit each job "
                        "(`oddl submit`)")
    if ctx.jobs:
        reqs = [JobRequest.of(e) for e in ctx.jobs]
        issues = [ConfigIssue(str(ctx.path), f"job {r.name!r}.shape",
                              f"no {r.shape} rectangle of {tb.grid.rows} x {tb.grid.cols} "
                              f"holds {r.ranks} ranks{' exactly (hier2d)' if r.exact else ''}"
                              + (f" in rows of whole tensor groups of {r.group}"
                                 if r.group > 1 else ""))
                  for r in reqs if not fits(grid, r.ranks, r.shape, r.exact, r.group)]
        if issues:
            raise ConfigError(issues)
        full = n_iter = sum(r.iterations for r in reqs)
        compute_ns, calibration = 0, "compute per job (docs/multijob.md)"
        flows = _flows(ctx, reqs)
        if not force:
            refuse_if_too_big(estimate(ctx, reqs, flows))
    else:
        w = ctx.workload
        full = total_iterations(w, w.ranks or tb.n_nodes)
        n_iter = iterations or exp.iterations or full
        lone = [_lone_job(ctx, n_iter, 0)]
        flows = _flows(ctx, lone)  # (the same whatever its compute)
        if not force:  # before the calibration, which runs a network too
            refuse_if_too_big(estimate(ctx, lone, flows))
        compute_ns, calibration = _calibrate(ctx, backend, grid, full, run_name)
        reqs = [_lone_job(ctx, n_iter, compute_ns)]
    on_iteration = _Recorder(store, bool(ctx.jobs), compute_ns, progress, n_iter)
    models = model_networks(ctx, reqs, flows)
    if not every_iteration and not ctx.jobs and n_iter > REPEATS_BY:
        # a job that repeats its iteration simulates its first few (sim/steady.py): a
        # worker process, a second of a core to start, would cost more than it saves
        few = [dataclasses.replace(r, iterations=REPEATS_BY) for r in reqs]
        models = model_networks(ctx, few, _flows(ctx, few))
    if workers is None:
        workers = _spare_cores() if sum(c for _s, c in models) >= PARALLEL_FROM_S else 0

    results: dict[str, NetworkResult] = {}
    jobs: dict[str, dict[str, dict[str, Any]]] = {r.name: {} for r in reqs} if ctx.jobs else {}
    violations: dict[str, list[str]] = {}
    # the model networks (baselines) beside the ODDL one, in up to `workers` processes:
    # they share nothing with it but the jobs (docs/performance.md)
    aside = [s for s, _c in models] if workers > 0 and remote is None and trace is None \
        else []
    elsewhere = {s.name for s in aside}
    pool = _Aside(ctx, aside, reqs, run_name, checker_mode, compute_ns, full,
                  store.path if store is not None else None, progress, workers, n_iter,
                  announce, not every_iteration) if aside else None
    try:
        for spec in exp.networks:
            if spec.name in elsewhere:
                continue
            if remote is not None and spec.kind == "oddl":
                _begin(ctx, spec, reqs, compute_ns, store)
                job, its = remote.run(ctx.path, spec.name, compute_ns, store, progress)
                res = results[spec.name] = _remote_result(
                    spec, job, its, full, exp.disturbance_threshold)
                if store is not None:
                    store.set_outcome(spec.name, res.disturbed, res.disturbance)
                continue
            results[spec.name], violations[spec.name], per_job = run_network(
                ctx, spec, reqs, backend, checker_mode, run_name, compute_ns, full, store,
                functools.partial(on_iteration, spec.name), announce, trace,
                not every_iteration)
            for job_name, pub in per_job.items():
                jobs[job_name][spec.name] = pub
        if pool is not None:
            pool.grow()  # this process only waits now: its core takes a model network
        for name, (res, viols, per_job) in (pool.results() if pool else {}).items():
            results[name], violations[name] = res, viols
            for job_name, pub in per_job.items():
                jobs[job_name][name] = pub
    finally:
        if pool is not None:
            pool.close()
    order = [s.name for s in exp.networks]  # the experiment's, whichever finished first
    results = {n: results[n] for n in order}
    jobs = {j: {n: per[n] for n in order if n in per} for j, per in jobs.items()}
    flat = [v for s in exp.networks for v in violations.get(s.name, [])]
    oddl = next((r for r in results.values() if r.kind == "oddl"), None)
    el = next((r for r in results.values() if r.kind == "electrical"), None)
    ratio = oddl.training_time_s / el.training_time_s if oddl and el and not ctx.jobs else None
    return RunResult(exp.name, backend, results, ratio, len(flat),
                     time.perf_counter() - t_wall, compute_ns, calibration, n_iter, full,
                     violations=flat, jobs=jobs)
