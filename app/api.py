"""oddl's public API, for scripts and notebooks (docs/api.md has a worked example).

    from oddl.app import api

    ctx = api.load_experiment("experiments/table1-resnet50.toml")
    result = api.run(ctx, iterations=50, out="runs/t1")   # or: await api.run_async(...)
    print(result.ratio, api.read_run("runs/t1")["networks"]["oddl"]["iterations"][0])

Everything here is data in, data out: configs are pydantic models, a plan is a `Plan`
(printable, diffable, JSON), a run is a `RunResult` plus a run directory that
`read_run` reads back. The names below are kept stable; anything else may change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oddl.app import collector
from oddl.controller.base.collectives import Schedule
from oddl.controller.base.config import (
    ConfigError,
    LoadedExperiment,
    NetworkSpec,
    Testbed,
    grid_testbed,
    load_experiment,
    load_testbed,
)
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.plan import Plan
from oddl.controller.stage1.planner import plan_job
from oddl.controller.stage2.job import built_schedule
from oddl.controller.stage2.workloads import model_spec

if TYPE_CHECKING:
    from oddl.app.experiments.remote import ArbiterClient
    from oddl.app.experiments.runner import Network, Progress, RunFailed, RunResult
    from oddl.app.experiments.runner import lone_network as network
    from oddl.controller.stage2.trace import Timeline

# the runner and what it stands on (numpy, the back ends, matplotlib, httpx) load on first
# use: `oddl plan` and `oddl check` need none of them (docs/performance.md)
def __getattr__(name: str) -> Any:
    if name in ("Network", "RunFailed", "RunResult", "network"):
        from oddl.app.experiments import runner

        return getattr(runner, "lone_network" if name == "network" else name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "LoadedExperiment",
    "Network",
    "Plan",
    "RunFailed",
    "RunResult",
    "Testbed",
    "check",
    "grid_testbed",
    "load_experiment",
    "load_testbed",
    "network",
    "plan",
    "read_run",
    "run",
    "run_async",
]


def plan(testbed: Testbed | str | Path, experiment: LoadedExperiment | None = None,
         strategy: str | None = None, network: NetworkSpec | None = None) -> Plan:
    """Stage 1's plan for an experiment's job on a testbed, as its ODDL `network` (default:
    its first) would run it: the workload's ranks, the network's collective and relay
    order (default: halving-doubling of ResNet-50 over every node); validated, nothing
    applied."""
    tb = testbed if isinstance(testbed, Testbed) else load_testbed(testbed)
    spec = network or NetworkSpec(name="oddl", kind="oddl")
    if experiment is not None:
        spec = network or next((s for s in experiment.experiment.networks
                                if s.kind == "oddl"), spec)
    grid = Grid.from_testbed(tb)
    with collector.tuned():
        sched, name = _schedule(tb, experiment, spec)
        p = plan_job(tb, grid, sched, name, strategy or spec.strategy, spec.relay)
        p.validate(grid)
    return p


def layout(p: Plan, experiment: LoadedExperiment | None = None) -> dict[str, Any]:
    """What `oddl plan` shows beside the tables: each node's optical degree against the
    ODDL network's `degree`, and a hybrid job's groups as the nodes they were placed on
    (each tensor group in one WSS row)."""
    spec = next((s for s in experiment.experiment.networks if s.kind == "oddl"), None) \
        if experiment is not None else None
    limit = spec.degree if spec is not None else NetworkSpec(name="oddl", kind="oddl").degree
    deg = p.degrees()
    out: dict[str, Any] = {"degree": deg, "degree_limit": limit,
                           "over_degree": [n for n, d in deg.items() if d > limit]}
    w = experiment.experiment.workload if experiment is not None else None
    if w is not None and w.parallelism is not None:
        ranks = p.jobs[0].ranks
        assert experiment is not None  # `w` is its workload
        grid = Grid.from_testbed(experiment.testbed)
        out["parallelism"] = {
            kind: [{"ranks": g, "nodes": [ranks[r] for r in g],
                    "rows": sorted({grid.coord[ranks[r]][0] for r in g})} for g in groups]
            for kind, groups in w.parallelism.hybrid(w.label, 4).groups().items()}
    return out


def _schedule(tb: Testbed, experiment: LoadedExperiment | None, spec: NetworkSpec
              ) -> tuple[Schedule, str]:
    """The job `plan` plans: the workload's collective on its ranks (default: ResNet-50's
    halving-doubling over every node), and its name."""
    model, coll, bpp, name, n = "resnet50", "hd", 4, "hd-all", tb.n_nodes
    hybrid = overlap = None
    if experiment is not None:
        w = experiment.workload
        model, coll, bpp, name, n = w.label, spec.collective or w.collective, \
            w.bytes_per_param, experiment.experiment.name, w.ranks or tb.n_nodes
        hybrid = w.parallelism.hybrid(model, bpp) if w.parallelism else None
        # (the buckets' sizes are what a plan routes; their times are the run's)
        overlap = experiment.recorded.overlap if experiment.recorded is not None else \
            w.ddp(model, w.batch_per_node or 0, bpp, 0)
    size = overlap.nbytes if overlap is not None else model_spec(model).grad_bytes(bpp)
    return built_schedule(coll, n, size, tb.grid.rows, tb.grid.cols, spec.degree,
                          spec.bidirectional, 0, hybrid, overlap), name


@dataclass(frozen=True)
class Recording:
    """A run's stage-2 deliveries, in the order they happened, and what replaying them
    through the model needs: the job's nodes, routes, flows and timing."""

    backend: str
    deliveries: list[tuple[str, str, str, int, int]]  # receiver, sender, kind, flow, hop
    nodes: list[str]
    routes: dict[str, dict[str, Any]]
    flows: dict[int, Any]
    timing: Any
    line_rate_gbps: float

    def replay(self) -> dict[str, Any]:
        from oddl.controller.stage2.verify import replay

        rate = self.line_rate_gbps
        v = replay(self.deliveries, self.nodes, self.routes, self.flows, self.timing,
                   functools.partial(_transfer_ns, rate))
        return {"backend": self.backend, "flows": len(self.flows), **dataclasses.asdict(v)}


class TraceIncomplete(ValueError):
    """A recorded iteration that lost events: no verdict can be given on it."""


def _transfer_ns(gbps: float, nbytes: int) -> int:
    return round(nbytes * 8 / gbps)


def record_stage2(experiment: str | Path, backend: str = "sim",
                  testbed: str | Path | None = None, force: bool = False) -> Recording:
    """One iteration of an experiment's ODDL network run on `backend`, its stage-2
    messages recorded by the timeline (`oddl run --trace`): `oddl verify trace`."""
    from oddl.app.experiments.runner import Timeline, run_experiment
    from oddl.app.session import session
    from oddl.controller.stage1.plan import Route
    from oddl.controller.stage2.job import timing_of, wire_routes
    from oddl.controller.stage2.trace import MAX_ROWS
    from oddl.controller.stage2.workloads import first_flows

    ctx = load_experiment(experiment, testbed)
    if ctx.jobs:
        raise ValueError(f"{experiment}: give an experiment of one workload, not [[jobs]]")
    oddl = next((s for s in ctx.experiment.networks if s.kind == "oddl"), None)
    if oddl is None:
        raise ValueError(f"{experiment}: no ODDL network to record")
    # a calibrated compute time (Table 1) is fitted on its network, which runs too: the
    # compute is before the iteration's messages, which are what is recorded
    cal = ctx.workload.calibrate
    nets = [oddl] + [s for s in ctx.experiment.networks
                     if cal is not None and s.name == cal.network and s is not oddl]
    ctx = dataclasses.replace(ctx, experiment=ctx.experiment.model_copy(
        update={"networks": nets, "faults": []}))
    timeline = Timeline(1)
    # its testbed as `oddl run` opens it: emu on a testbed, a private emulator; the lock
    with session(ctx.testbed_path, ctx.testbed, backend,
                 f"oddl verify trace {ctx.path}", say=lambda _line: None) as s:
        if s.testbed != ctx.testbed_path:  # the emulator's config
            ctx = dataclasses.replace(ctx, testbed=load_experiment(ctx.path,
                                                                   s.testbed).testbed)
        res = run_experiment(ctx, backend, None, 1, trace=timeline, force=force)
    dropped = res.networks[oddl.name].stats.get("trace_dropped", 0)
    if dropped:  # a partial record would make a false verdict: none is given
        raise TraceIncomplete(
            f"{experiment}: the iteration's record is incomplete: {dropped:,} of its events "
            f"were over the bound of {MAX_ROWS:,} a node reports at once and were dropped, "
            f"so no verdict can be given (check a smaller grid or job)")
    rows = sorted((r for r in timeline.chrome.rows[oddl.name] if r.kind == "recv"),
                  key=lambda r: r.t0)
    tb = ctx.testbed
    p = plan(tb, ctx, network=oddl)
    flows = first_flows(_schedule(tb, ctx, oddl)[0], p.jobs[0].ranks)
    return Recording(backend, [(r.node, r.peer, r.what, r.flow, r.hop) for r in rows],
                     list(Grid.from_testbed(tb).nodes),
                     {x: {d: Route(*r) for d, r in rs.items()}
                      for x, rs in wire_routes(p).items()},
                     flows, timing_of(tb), tb.optical.line_rate_gbps)


def check(path: str | Path) -> str:
    """`oddl check`: a testbed, experiment or sweep config validated as what loads it would,
    and an experiment's ODDL networks planned as stage 1 would (one workload on the whole
    testbed; several jobs: the partitions of those that start at once, checked isolated);
    each point of a sweep generated and validated. Returns the one-line verdict; raises
    ConfigError with every issue (file, field, reason)."""
    from oddl.app.experiments.sweep import load_sweep, points
    from oddl.controller.base.config import ConfigIssue, kind_of, load_job
    from oddl.controller.service.jobs import JobRequest
    from oddl.controller.service.placing import plan_partitions
    from oddl.controller.stage1.plan import PlanError

    path = Path(path)
    kind = kind_of(path)
    if kind == "sweep":
        sw, tb_path = load_sweep(path)  # its template and every point validated
        shapes = {(p["nodes"], p["line_rate_gbps"]) for p in points(sw)}
        return (f"OK {path}: sweep {sw.name} on {tb_path}: {len(points(sw))} points "
                f"({len(shapes)} generated testbeds)")
    if kind == "job":
        w = load_job(path).workload
        assert w is not None
        return (f"OK {path}: a job for an arbiter (`oddl submit`): {w.model}, {w.collective}, "
                f"{w.ranks or 'every'} ranks; its testbed is the arbiter's, which checks "
                f"the rest when it is submitted")
    if kind == "testbed":
        tb = load_testbed(path)
        n_ch = len(tb.optical.wavelengths())
        try:
            plan(tb)  # what `oddl plan TESTBED` plans: a testbed no job plans on is wrong
        except PlanError as e:
            raise ConfigError([ConfigIssue(
                str(path), "optical", f"the default job (halving-doubling over every node, "
                f"as `oddl plan` plans it) cannot be planned with {n_ch} wavelength"
                f"{'s' * (n_ch != 1)}: {e}")]) from None
        return (f"OK {path}: {tb.name}, {tb.grid.rows} x {tb.grid.cols} grid, {tb.n_nodes} "
                f"nodes, {len(tb.wss)} WSSs, {n_ch} wavelengths")
    ctx = load_experiment(path)
    tb = ctx.testbed
    grid = Grid.from_testbed(tb)
    for i, spec in enumerate(ctx.experiment.networks):
        if spec.kind != "oddl":
            continue
        try:
            if ctx.jobs:
                plan_partitions(tb, grid, [JobRequest.of(j) for j in ctx.jobs],
                                ctx.experiment.policy, spec)
            else:
                plan(tb, ctx, network=spec)
        except PlanError as e:
            raise ConfigError([ConfigIssue(str(path), f"networks[{i}]",
                                           f"cannot be planned on {ctx.testbed_path}: {e}")]
                              ) from None
    jobs = f", {len(ctx.jobs)} jobs" if ctx.jobs else ""
    return f"OK {path}: experiment {ctx.experiment.name} on {tb.name}{jobs}"


def run(experiment: LoadedExperiment | str | Path, backend: str = "sim",
        iterations: int | None = None, out: str | Path | None = None, *,
        progress: Progress | None = None, trace: Timeline | None = None,
        publish: bool = False, say: Callable[[str], None] = print,
        arbiter: ArbiterClient | None = None, workers: int | None = None,
        force: bool = False, plot: bool = True, every_iteration: bool = False) -> RunResult:
    """Run every network of an experiment (`oddl run`): emu on a sim testbed starts a
    private emulator of it, hw holds the testbed lock, `publish` tells a sim run's
    watchers (app/session.py); hw with `arbiter`: the testbed's arbiter
    runs the ODDL network's job (it holds the lock). With `out`, into a run directory:
    manifest.json, results.sqlite (every iteration as it completes: a killed run keeps
    them), summary.json, plot.png (one workload) or jct-cdf.png (several jobs), and for
    an emulated run the emulator's log. `workers`: processes for the model networks
    beside the ODDL one (default: one per spare core, for a run long enough to pay for
    starting them; one more once this process has run its own; 0: all in this one). A
    run that would take hours or more memory than is free raises TooBig (with the
    estimate) unless `force`. `plot=False`: no figure (drawing it costs half a second
    of CPU, a helper process's on a spare core while the run runs: plotter.py). A model
    network's job that repeats its iteration ends in copies of it (sim/steady.py: the
    same figures and records, to the byte), unless `every_iteration`."""
    from oddl.app.experiments.figures import iteration_parts, paper_rows
    from oddl.app.experiments.plotter import plotting
    from oddl.app.experiments.results import (
        RunStore,
        make_run_dir,
        read_store,
        write_manifest,
    )
    from oddl.app.experiments.runner import run_experiment
    from oddl.app.session import serving, session

    ctx = experiment if isinstance(experiment, LoadedExperiment) else \
        load_experiment(experiment)
    serving(ctx.testbed_path, ctx.testbed)  # before a run directory is made for it
    exp = ctx.experiment
    run_dir = make_run_dir(Path(out), exp.name) if out is not None else None
    # (its figure's helper, if it has one, imports matplotlib on a spare core meanwhile)
    with plotting(run_dir is not None and plot) as plotter:
        store = None
        if run_dir is not None:
            write_manifest(run_dir, {"experiment": ctx.path, "testbed": ctx.testbed_path},
                           {"seed": exp.seed, "backend": backend,
                            "experiment": exp.model_dump(),
                            "testbed": ctx.testbed.model_dump(exclude={"nodes", "wss"})})
            store = RunStore(run_dir / "results.sqlite")
        try:
            from oddl.app import registry

            remote = arbiter if registry.kind(backend).served_by_arbiter else None
            with session(ctx.testbed_path, ctx.testbed, backend, f"oddl run {ctx.path}",
                         publish=publish, say=say, locked=remote is not None,
                         log=run_dir / "emulator.log" if run_dir is not None else None) as s:
                if s.testbed != ctx.testbed_path:  # the emulator's config
                    ctx = load_experiment(ctx.path, s.testbed)
                res = run_experiment(ctx, backend, store, iterations, progress, trace=trace,
                                     announce=s.announce, remote=remote, workers=workers,
                                     force=force, every_iteration=every_iteration)
        finally:
            if store is not None:
                store.close()
        if run_dir is not None:
            res.run_dir = str(run_dir)
            (run_dir / "summary.json").write_text(json.dumps(res.summary(exp.reference),
                                                             indent=1))
        if run_dir is not None and plotter is not None:
            title = f"{exp.name} ({backend})"
            if res.jobs:
                plotter.draw("jct_cdf", {"title": f"{title}: {len(res.jobs)} jobs",
                                         "jobs": res.jobs}, run_dir / "jct-cdf.png")
            else:
                its = read_store(run_dir / "results.sqlite", flow_rows=False)
                plotter.draw("run", {"title": title,
                                     "networks": iteration_parts(its, res.training_min()),
                                     "paper": [dataclasses.asdict(r) for r in paper_rows(
                                         exp.reference, res.training_min(), res.ratio)]},
                             run_dir / "plot.png")
    return res


async def run_async(experiment: LoadedExperiment | str | Path, backend: str = "sim",
                    iterations: int | None = None, out: str | Path | None = None
                    ) -> RunResult:
    """`run` from a running event loop (a notebook's): the sim back end keeps its own
    virtual clock, so the run goes to a worker thread and your loop stays responsive."""
    return await asyncio.to_thread(run, experiment, backend, iterations, out,
                                   say=lambda _line: None)


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """A run directory: its manifest, summary and every recorded iteration (per network)."""
    from oddl.app.experiments.results import read_store

    d = Path(run_dir)
    summary = d / "summary.json"
    return {"manifest": json.loads((d / "manifest.json").read_text()),
            "summary": json.loads(summary.read_text()) if summary.exists() else None,
            "networks": read_store(d / "results.sqlite")}
