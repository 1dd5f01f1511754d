"""`oddl examples`, `check`, `plan`, `compat`, `run`, `sweep`: configs, plans and
experiments."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from oddl.app.cli.main import (
    Finite,
    _config_fail,
    console,
    control_model_options,
    emit,
    err,
    fail,
    key_option,
    main,
    new_file,
    verilator_ready,
)
from oddl.app.cli.run_report import jobs_report, run_report, run_warnings
from oddl.controller.base.catalog import BACKENDS, STRATEGIES
from oddl.controller.base.config import ConfigError, load_experiment, load_testbed
from oddl.controller.base.extras import require
from oddl.controller.serving.lifecycle import Stopped
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
def examples(directory: Path) -> None:
    """Copy the shipped testbeds and experiments into DIRECTORY (its hw_configs/ and
    experiments/), to run and edit: a wheel install has them nowhere else. Overwrites
    nothing."""
    from oddl.app.examples import NoExamples, copy_to

    try:
        files = copy_to(directory)
    except (NoExamples, FileExistsError) as e:
        fail(str(e))
    for folder in ("hw_configs", "experiments"):
        n = sum(f.parent.name == folder for f in files)
        click.echo(f"{directory / folder}/: {n} files")
    click.echo(f"try: oddl run {directory / 'experiments' / 'table1-resnet50.toml'} "
               f"--iterations 500")


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
def check(file: Path) -> None:
    """Validate a testbed, experiment or sweep config: OK, or every error with its field.
    An experiment's ODDL networks are planned too (nothing is applied)."""
    from oddl.app.api import check as check_config

    try:
        click.echo(check_config(file))
    except ConfigError as e:
        _config_fail(e)


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--job", "job", type=click.Path(path_type=Path), default=None,
              help="experiment whose workload the plan serves (default: HD over all nodes)")
@click.option("--strategy", type=click.Choice(STRATEGIES),
              default=None, help="override the experiment's strategy")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="PNG: each WSS table as a heat map (input x wavelength -> output)")
@click.option("--search", is_flag=True,
              help="the best tensor x pipeline x data split of the --job's Transformer on "
                   "its TopoOpt (with the topology) and SiP-ML networks (within the degree)")
def plan(testbed: Path, job: Path | None, strategy: str | None, as_json: bool,
         plot: Path | None, search: bool) -> None:
    """Stage 1: print the plan (placement, WSS tables, routes), validated."""
    from oddl.app import api
    from oddl.controller.base.topology import Grid
    from oddl.controller.stage1.plan import PlanError

    try:
        ctx = load_experiment(job, testbed) if job is not None else None
        if search:
            if ctx is None or ctx.jobs:
                raise click.UsageError("--search needs --job EXPERIMENT of one [workload]")
            _search(ctx, as_json)
            return
        if ctx is not None and ctx.jobs:
            _plan_jobs(ctx, strategy, as_json, plot)
            return
        tb = ctx.testbed if ctx is not None else load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    t0 = time.perf_counter()
    grid = Grid.from_testbed(tb)
    try:
        p = api.plan(tb, ctx, strategy)
    except (PlanError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    strat = p.strategy
    dt = time.perf_counter() - t0
    if plot is not None:
        from oddl.app.experiments.figures import plan_figure, save

        save(plan_figure(p), plot)
        click.echo(f"wrote {plot}", err=True)
    lay = api.layout(p, ctx)
    if as_json:
        emit({**p.to_dict(), **lay}, indent=1)
    else:
        click.echo("\n".join(p.summary_lines()))
        degs = lay["degree"]
        click.echo(f"\noptical degree (nodes a node's light reaches directly): max "
                   f"{max(degs.values(), default=0)}, limit {lay['degree_limit']}"
                   + (f"; over it: {', '.join(lay['over_degree'][:8])}"
                      if lay["over_degree"] else ""))
        for kind, groups in lay.get("parallelism", {}).items():
            click.echo(f"{kind} groups: " + "; ".join(
                f"{' '.join(g['nodes'])} (row{'s' * (len(g['rows']) > 1)} "
                f"{', '.join(map(str, g['rows']))})" for g in groups[:4])
                + (f"; ... {len(groups) - 4} more" if len(groups) > 4 else ""))
        if strat == "totientperms":  # what the jumps cost a flow inside each WSS's group
            from oddl.controller.base.jumps import JumpSet, totient_jumps

            sizes = sorted({len(grid.groups[(t.axis, t.index)].members) for t in p.wss})
            w = len(tb.optical.wavelengths())
            click.echo("\ntotientperms, per WSS group: " + "; ".join(
                str(JumpSet.of(n, totient_jumps(n, w))) for n in sizes))
        click.echo(f"\nvalid: no collisions, {len(p.demand)} pairs routable "
                   f"(planned in {dt:.2f} s)")


@main.command()
@click.option("--job", "jobs", multiple=True, required=True,
              help="MODEL[:RANKS] (measured on a link of --link-gbps, RANKS default 4), or "
                   "NAME:ITER_MS:COMM_MS[:DEMAND], a raw profile; DEMAND is the share of the "
                   "link it uses while communicating (default 1)")
@click.option("--link-gbps", type=Finite(min=0, min_open=True, max=1e5),
              default=100.0, show_default=True, help="the shared link (model jobs)")
@click.option("--json", "as_json", is_flag=True, help="print score, rotations, shifts_ms")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="PNG: the unified circle, each job's demand as rotated")
def compat(jobs: tuple[str, ...], link_gbps: float, as_json: bool, plot: Path | None
           ) -> None:
    """CASSINI's compatibility of jobs sharing one link: the score, the best rotations on
    the unified circle and the time shifts that realise them."""
    from oddl.app.registry import profiles_on_a_link
    from oddl.controller.stage1.compat import compatibility, parse_job, parse_model_job, rolled

    try:
        models = [parse_model_job(j) for j in jobs]
        if all(models):
            seen: dict[str, int] = {}
            named = []
            for model, ranks in filter(None, models):
                seen[model] = seen.get(model, 0) + 1
                named.append((model if seen[model] == 1 else f"{model}-{seen[model]}", model,
                              ranks))
            profiles = profiles_on_a_link(named, link_gbps)
        elif any(models):
            raise ValueError("--job: give models (MODEL[:RANKS]) or raw profiles "
                             "(NAME:ITER_MS:COMM_MS[:DEMAND]), not both")
        else:
            profiles = [parse_job(j) for j in jobs]
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    for p in profiles:
        busy = sum(1 for x in p.demand if x > 0.01) / len(p.demand)
        click.echo(f"{p.name}: iteration {p.iteration_ms:.3f} ms, on the link "
                   f"{busy:.1%} of it", err=True)
    c = compatibility(profiles)
    if plot is not None:
        from oddl.app.experiments.figures import circle_figure, save

        save(circle_figure([p.name for p in profiles], rolled(profiles, c), c.score,
                           c.perimeter_ms), plot)
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        emit({"score": c.score, "rotations": dict(zip(
            (p.name for p in profiles), c.rotations_deg, strict=True)),
            "shifts_ms": dict(zip((p.name for p in profiles), c.shifts_ms, strict=True)),
            "perimeter_ms": c.perimeter_ms})
        return
    click.echo(f"unified circle: {c.perimeter_ms:g} ms; compatibility score {c.score:.4f}"
               f" ({'compatible' if c.score >= 1 - 1e-9 else 'not compatible'})")
    for p, rot, s in zip(profiles, c.rotations_deg, c.shifts_ms, strict=True):
        click.echo(f"  {p.name}: rotate {rot:.1f} deg = start {s:g} ms later")


def _search(ctx: Any, as_json: bool) -> None:
    """`oddl plan --search`: TopoOpt's strategy-and-topology search, SiP-ML's split within
    its degree, on each such network of the experiment."""
    from oddl.app import registry
    from oddl.controller.base.catalog import TRANSFORMERS
    from oddl.controller.base.config import Parallelism

    w, tb = ctx.workload, ctx.testbed
    if w.model not in TRANSFORMERS:
        click.echo(f"error: {ctx.path}: --search splits a Transformer ({', '.join(TRANSFORMERS)}"
                   f"), not {w.label}", err=True)
        sys.exit(2)
    nets = [s for s in ctx.experiment.networks if s.kind in ("topoopt", "sipring", "sipocs")]
    if not nets:
        click.echo(f"error: {ctx.path} has no topoopt, sipring or sipocs network to search "
                   f"a split for", err=True)
        sys.exit(2)
    n = w.ranks or tb.n_nodes
    base = (w.parallelism or Parallelism(data=n)).hybrid(w.label, w.bytes_per_param)
    from oddl.controller.base.topology import Grid

    nodes = list(Grid.from_testbed(tb).nodes)
    out = []
    try:
        for spec in nets:
            t0 = time.perf_counter()
            r = registry.search_split(spec, base, w.collective, nodes,
                                      tb.optical.line_rate_gbps)
            out.append((r, time.perf_counter() - t0))
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if as_json:
        emit({r.network: r.to_dict() for r, _s in out}, indent=1)
        return
    for r, secs in out:
        click.echo(f"{r.network} ({r.kind}, degree {r.degree}): best {r.best}, "
                   f"{r.iteration_ms:.3f} ms an iteration (predicted; {r.found_by}; "
                   f"searched in {secs:.1f} s)")
        if r.topology:
            click.echo(f"  topology: {r.topology}")
        for k, row in enumerate(r.rounds):
            what = "each on its own topology" if r.kind == "topoopt" and k == len(
                r.rounds) - 1 else f"round {k + 1}"
            click.echo(f"  {what}: " + ", ".join(
                f"{c.split} {c.iteration_ms:.2f} ms" if c.iteration_ms is not None
                else f"{c.split} - ({c.why_not})" for c in row))


def _plan_jobs(ctx: Any, strategy: str | None, as_json: bool, plot: Path | None) -> None:
    """`oddl plan --job` for several jobs: each job's partition and plan."""
    from oddl.controller.base.config import NetworkSpec
    from oddl.controller.base.topology import Grid
    from oddl.controller.service.jobs import JobRequest
    from oddl.controller.service.placing import plan_partitions
    from oddl.controller.stage1.plan import PlanError

    tb = ctx.testbed
    nets = [s for s in ctx.experiment.networks if s.kind == "oddl"]
    spec = nets[0] if nets else NetworkSpec(name="oddl", kind="oddl")
    if strategy is not None:
        spec = spec.model_copy(update={"strategy": strategy})
    grid = Grid.from_testbed(tb)
    t0 = time.perf_counter()
    try:
        plans, waiting = plan_partitions(tb, grid, [JobRequest.of(j) for j in ctx.jobs],
                                         ctx.experiment.policy, spec)
    except (PlanError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    dt = time.perf_counter() - t0
    if plot is not None:
        from oddl.app.experiments.figures import partition_figure, save

        cells = {grid.coord[n]: part.job for part, _ in plans for n in part.nodes}
        save(partition_figure(f"{ctx.experiment.name} on {tb.name}: the partitions of the "
                              f"jobs that start at once", tb.grid.rows, tb.grid.cols, cells),
             plot)
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        emit({"jobs": {p.job: {"partition": {
            "shape": p.shape, "rows": list(p.rows), "cols": list(p.cols),
            "ranks": list(p.ranks), "spare": list(p.spare)}, "plan": plan.to_dict(),
            "degree": plan.degrees()}
            for p, plan in plans}, "waiting": [r.name for r in waiting]}, indent=1)
        return
    click.echo(f"{ctx.experiment.name} on {tb.name}: {len(plans)} jobs start at once "
               f"({ctx.experiment.policy}), strategy {spec.strategy}")
    for part, plan in plans:
        used = sorted({t.wss for t in plan.wss})
        click.echo(f"  {part.describe()}; {max((len(t.labels) for t in plan.wss), default=0)}"
                   f" channels on {len(used)} WSSs ({', '.join(used[:4])}"
                   f"{' ...' if len(used) > 4 else ''})")
    if waiting:
        click.echo(f"waiting for nodes: {', '.join(r.name for r in waiting[:20])}"
                   f"{' ...' if len(waiting) > 20 else ''}")
    click.echo(f"\nisolated: no two jobs share a node (rank, relay or receiver) or a WSS "
               f"(output port, wavelength) (planned in {dt:.2f} s)")


def hot_path_said() -> None:
    """One line on stderr when the hot path runs interpreted and nobody asked for it: a
    run then takes longer than the docs' figures (docs/performance.md)."""
    from oddl.controller.base import compiled

    line = compiled.state()
    if not line.startswith("hot path compiled") and not compiled.interpreted_by_choice():
        click.echo(f"note: {line}", err=True)


def _run_setup(experiment: Path, testbed: Path | None, backend: str,
               board_model: str | None, out: Path | None,
               control_model: str | None = None, rtl_simulator: str | None = None
               ) -> tuple[Any, Path]:
    """What `oddl run` checks before it runs: the experiment on its testbed, the board
    and control unit models for the back end, the gateware extra they need, the run
    directory."""
    from oddl.app.experiments.results import RunDirTaken, make_run_dir
    from oddl.app.registry import kind

    try:
        ctx = load_experiment(experiment, testbed)
    except ConfigError as e:
        _config_fail(e)
    if board_model is not None:
        if not kind(backend).models_boards:
            fail("--board-model: a lab's boards are what they are (sim and emu model them)")
        ctx = dataclasses.replace(ctx, testbed=ctx.testbed.with_board_model(board_model))
    if control_model is not None or rtl_simulator is not None:
        if not kind(backend).models_boards:
            fail("--control-model: a lab's node programs run the Python unit (sim and emu "
                 "model it)")
        ctx = dataclasses.replace(ctx, testbed=ctx.testbed.with_control_model(
            control_model, rtl_simulator))
    m = ctx.testbed.testbed
    if m.board_model == "rtl":
        require("gateware", "the RTL board model (--board-model rtl)")
    if m.control_model == "rtl":
        require("gateware", "the RTL control unit (--control-model rtl)")
    if "rtl" in (m.board_model, m.control_model) and m.rtl_simulator == "verilator":
        verilator_ready()
    from oddl.app.session import serving

    try:
        serving(ctx.testbed_path, ctx.testbed)  # an emu config's emulator still serves
        return ctx, make_run_dir(out, ctx.experiment.name)
    except ConfigError as e:
        _config_fail(e)
    except RunDirTaken as e:
        fail(str(e))


@main.command()
@click.argument("experiment", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(BACKENDS), default="sim", show_default=True,
              help="sim: the testbed modelled in virtual time; emu: its devices emulated "
                   "(`oddl emulate`, started privately for a testbed, or the one an emu "
                   "config names) in real time; hw: a lab's boards")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="run directory (default: runs/<experiment>-<time>)")
@click.option("--iterations", type=click.IntRange(min=1), default=None,
              help="run only N iterations and extrapolate the training time")
@click.option("--every-iteration", is_flag=True,
              help="sim: simulate every iteration (default: once a job's iteration repeats "
                   "exactly, the rest are written as its copies, with the same figures and "
                   "records; docs/performance.md)")
@click.option("--testbed", type=click.Path(path_type=Path), default=None,
              help="use this testbed instead of the experiment's")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
@click.option("--trace", "trace_file", type=click.Path(path_type=Path), default=None,
              help="write a timeline of stage 2 (Chrome trace-event JSON; Perfetto opens it)")
@click.option("--trace-iterations", type=click.IntRange(1, 1000), default=2, show_default=True,
              help="how many iterations, from the first, --trace records")
@click.option("--publish", is_flag=True,
              help="sim: tell the testbed's bus (its dashboard) as the run goes; emu and hw "
                   "runs always do")
@click.option("--arbiter", "arbiter_url", envvar="ODDL_ARBITER", default=None,
              help="hw: the testbed's arbiter runs the ODDL network's job (or ODDL_ARBITER)")
@click.option("--token-file", envvar="ODDL_TOKEN_FILE", default=None,
              type=click.Path(path_type=Path), help="your token for it (or ODDL_TOKEN_FILE)")
@click.option("--board-model", type=click.Choice(["python", "rtl"]), default=None,
              help="sim and emu: each O-NIC as the Python board model, or as the gateware "
                   "simulated cycle by cycle, with --control-model board the whole onic_top, its "
                   "control unit inside (default: the testbed's; docs/gateware.md)")
@control_model_options
@click.option("--force", is_flag=True,
              help="run it even if the estimate says it would take more than an hour or "
                   "more memory than is free (refused otherwise, with the estimate)")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="processes for the baseline networks beside the ODDL one (default: one "
                   "per spare core when they are estimated at a second or more, and one "
                   "more once this process has run its own; 0: every network in this "
                   "process)")
@click.option("--record", type=click.Path(path_type=Path, dir_okay=False), default=None,
              callback=new_file,
              help="emu and hw: write every exchange with the devices to this cassette "
                   "(.jsonl.gz), for `oddl replay` (docs/cassettes.md)")
@key_option("--record-key", "sign the cassette with the key in this file (HMAC-SHA256)")
@click.option("--plot/--no-plot", default=True, show_default=True, envvar="ODDL_PLOT",
              show_envvar=True,
              help="draw plot.png (or jct-cdf.png) into the run directory: half a second "
                   "of CPU, a helper process's on a spare core while the run runs (a "
                   "script's many runs: --no-plot)")
def run(experiment: Path, backend: str, out: Path | None, iterations: int | None,
        every_iteration: bool, testbed: Path | None, as_json: bool, trace_file: Path | None,
        trace_iterations: int, publish: bool, arbiter_url: str | None,
        token_file: Path | None, board_model: str | None, control_model: str | None,
        rtl_simulator: str | None, workers: int | None, force: bool, record: Path | None,
        key: bytes | None, plot: bool) -> None:
    """Run an experiment: every network on the same workload, results in a run directory."""
    from oddl.app import api, registry
    from oddl.app.experiments.estimate import TooBig
    from oddl.app.experiments.remote import ArbiterClient
    from oddl.app.experiments.runner import Timeline
    from oddl.controller.service.lock import TestbedBusy
    from oddl.controller.stage1.plan import PlanError

    ctx, run_dir = _run_setup(experiment, testbed, backend, board_model, out, control_model,
                              rtl_simulator)
    hot_path_said()
    prog = Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=as_json,
                    disable=not err.is_terminal and as_json)
    tasks: dict[str, TaskID] = {}
    last = [0.0]
    timeline = Timeline(trace_iterations) if trace_file is not None else None

    def progress(name: str, done: int, total: int) -> None:
        if name not in tasks:
            tasks[name] = prog.add_task(name, total=total)
        now = time.monotonic()
        if done == total or now - last[0] > 0.1:
            last[0] = now
            prog.update(tasks[name], completed=done)

    if record is not None and not registry.kind(backend).devices:
        click.echo(f"error: --record: a {backend} run reaches no device (emu or hw)",
                   err=True)
        sys.exit(2)
    taping = registry.recording(record, {
        "kind": "run", "argv": sys.argv[1:], "experiment": ctx.path.read_text(),
        "testbed": ctx.testbed_path.read_text(), "backend": backend,
        "iterations": iterations}, key) if record is not None else contextlib.nullcontext()
    try:
        with prog, taping as tape:
            res = None
            try:
                res = api.run(ctx, backend, iterations, run_dir, progress=progress,
                              trace=timeline, publish=publish, say=err.print,
                              arbiter=ArbiterClient(arbiter_url, token_file)
                              if arbiter_url and token_file else None, workers=workers,
                              force=force, plot=plot, every_iteration=every_iteration)
            finally:
                if tape is not None:
                    err.print(tape.close({"result": res.to_json_obj() if res is not None
                                          else None}))
    except Stopped as e:
        e.notes.append(f"every completed iteration is in {run_dir / 'results.sqlite'}")
        raise
    except TestbedBusy as e:
        hint = ("\n(an arbiter serves this testbed: with ODDL_ARBITER and ODDL_TOKEN_FILE, "
                "or --arbiter and --token-file, `oddl run --backend hw` submits to it)"
                if "oddl arbiter" in str(e) else "")
        click.echo(f"error: {e}{hint}", err=True)
        sys.exit(3)
    except PlanError as e:
        click.echo(f"error: {experiment}: networks: cannot be planned: {e}", err=True)
        sys.exit(2)
    except TooBig as e:
        click.echo(f"error: {experiment}: {e}", err=True)
        sys.exit(2)
    except ConfigError as e:  # what the run needs of its testbed, found as it opened it
        _config_fail(e)
    except Exception as e:  # a device, the broker, credentials: say which, keep what ran
        if os.environ.get("ODDL_DEBUG"):
            raise
        why = str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
        click.echo(f"error: run failed: {why}\n(completed iterations are in "
                   f"{run_dir / 'results.sqlite'}; ODDL_DEBUG=1 shows the traceback)",
                   err=True)
        sys.exit(1)
    if timeline is not None and trace_file is not None:
        timeline.chrome.write(trace_file)
        err.print(f"trace: {trace_file} ({len(timeline.chrome.events())} events; "
                  f"open it in https://ui.perfetto.dev or chrome://tracing)")
    if res.jobs:
        jobs_report(res, run_dir, backend, as_json)
        sys.exit(1 if res.invariant_violations else 0)
    if as_json:
        emit(res.to_json_obj())
    else:
        run_report(res, ctx, backend, run_dir)
    run_warnings(res, ctx)
    if res.invariant_violations:
        sys.exit(1)


@main.command()
@click.argument("sweep_file", metavar="SWEEP", type=click.Path(path_type=Path))
@click.option("--jobs", type=int, default=1, help="local worker processes")
@click.option("--cluster", default=None,
              help="a Dask scheduler address (tcp://HOST:PORT or tls://...) to run on")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="output directory (default: sweeps/<name>-<time>); rerun into the same "
                   "one to resume: points already in its points.jsonl are kept")
def sweep(sweep_file: Path, jobs: int, cluster: str | None, out: Path | None) -> None:
    """Run networks x models x node counts x line rates; write the table and the plots."""
    hot_path_said()
    from oddl.app.experiments.sweep import (
        load_sweep,
        points,
        run_sweep,
        speedups,
        write_outputs,
    )

    if cluster:
        require("cluster", "oddl sweep --cluster")
    try:
        sw, tb_path = load_sweep(sweep_file)
    except ConfigError as e:
        _config_fail(e)
        return
    out = out or Path("sweeps") / f"{sw.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    total = len(points(sw))
    t0 = time.perf_counter()
    where = f"Dask cluster {cluster}" if cluster else f"{jobs} local process(es)"
    err.print(f"{sw.name}: {total} points on {where}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err) as bar:
        task = bar.add_task("sweep", total=total)

        def progress(row: dict[str, Any], done: int, total: int) -> None:
            bar.update(task, completed=done, description=(
                f"{row['network']} {row['model']} {row['nodes']}n "
                f"{row['line_rate_gbps']:g}G"))

        journal = out / "points.jsonl"
        done_before = sum(1 for _ in journal.open()) if journal.exists() else 0
        if done_before:
            err.print(f"resuming: {done_before} points already in {journal}")
        try:
            rows = run_sweep(sw, tb_path, jobs, cluster, progress, journal)
        except Exception as e:  # a failed point names itself; finished points are kept
            kept = sum(1 for _ in journal.open()) if journal.exists() else 0
            click.echo(f"error: sweep point failed: {e}", err=True)
            click.echo(f"{kept} finished points kept in {journal}", err=True)
            sys.exit(1)
    files = write_outputs(sw, rows, out)
    r = Table(title=f"{sw.name}: one iteration per point")
    for col in ("network", "model", "nodes", "Gb/s", "iteration ms", "ctl msgs/node",
                "plan ms", "wall s"):
        r.add_column(col, justify="left" if col in ("network", "model") else "right")
    for x in rows:
        r.add_row(x["network"], x["model"], str(x["nodes"]), f"{x['line_rate_gbps']:g}",
                  f"{x['iteration_ms']:.3f}", f"{x['control_msgs_per_node']:g}",
                  "-" if x["plan_ms"] is None else f"{x['plan_ms']:.1f}", f"{x['wall_s']:.1f}")
    console.print(r)
    ups = speedups(sw, rows)  # none with one network: nothing to compare it with
    t = Table(title=f"{sw.reference} speedup over each network (iteration time)")
    marks = sw.paper_marks()
    for col in ("model", "nodes", "Gb/s", "over", "speedup", "comm only", "paper"):
        t.add_column(col, justify="right" if col not in ("model", "over") else "left")
    for s in ups:
        v, upto = marks.get(s["over"], (None, False))
        t.add_row(s["model"], str(s["nodes"]), f"{s['line_rate_gbps']:g}", s["over"],
                  f"{s['speedup']:.3f}x",
                  f"{s['comm_speedup']:.3f}x" if s["comm_speedup"] else "-",
                  "-" if v is None else f"{'up to ' if upto else ''}{v:g}x")
    if ups:
        console.print(t)
    bad = sum(r["invariant_violations"] for r in rows)
    click.echo(f"{len(rows)} points in {time.perf_counter() - t0:.1f} s wall; "
               f"invariant violations: {bad}; wrote {', '.join(str(f) for f in files)}")
    if bad:
        sys.exit(1)
