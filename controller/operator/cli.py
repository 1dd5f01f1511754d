"""The `oddl` command line."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from oddl.controller.base.catalog import BACKENDS, STRATEGIES
from oddl.controller.base.config import ConfigError, load_experiment, load_testbed
from oddl.controller.base.faultkinds import cli_help
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

err = Console(stderr=True)
console = Console(width=None if sys.stdout.isatty() else 120)


def _config_fail(e: ConfigError) -> None:
    for issue in e.issues:
        click.echo(f"error: {issue}", err=True)
    sys.exit(2)


@click.group()
@click.version_option(package_name="oddl")
def main() -> None:
    """oddl: the ODDL optical interconnect testbed controller.

    ODDL_LOG=info (or debug) says more on stderr; warnings are always said."""
    import logging
    import os

    level = os.environ.get("ODDL_LOG", "warning").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise click.UsageError(f"ODDL_LOG={level.lower()}: one of debug, info, warning, error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
def check(file: Path) -> None:
    """Validate a testbed, experiment or sweep config: OK, or every error with its field.
    An experiment's ODDL networks are planned too (nothing is applied)."""
    from oddl.controller.operator.api import check as check_config

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
def plan(testbed: Path, job: Path | None, strategy: str | None, as_json: bool,
         plot: Path | None) -> None:
    """Stage 1: print the plan (placement, WSS tables, routes), validated."""
    from oddl.controller.base.collectives import build
    from oddl.controller.base.topology import Grid
    from oddl.controller.stage1.plan import PlanError
    from oddl.controller.stage1.planner import plan_job
    from oddl.controller.stage2.workloads import model_spec

    try:
        if job is not None:
            ctx = load_experiment(job, testbed)
            if ctx.jobs:
                _plan_jobs(ctx, strategy, as_json, plot)
                return
            tb, w = ctx.testbed, ctx.workload
            nets = [s for s in ctx.experiment.networks if s.kind == "oddl"]
            strat = strategy or (nets[0].strategy if nets else "matched")
            model, coll, bpp, name = w.model, w.collective, w.bytes_per_param, ctx.experiment.name
        else:
            tb = load_testbed(testbed)
            strat, model, coll, bpp, name = strategy or "matched", "resnet50", "hd", 4, "hd-all"
    except ConfigError as e:
        _config_fail(e)
        return
    t0 = time.perf_counter()
    grid = Grid.from_testbed(tb)
    try:
        sched = build(coll, tb.n_nodes, model_spec(model).grad_bytes(bpp), tb.grid.rows,
                      tb.grid.cols)
        p = plan_job(tb, grid, sched, name, strat)
        p.validate(grid)
    except (PlanError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    dt = time.perf_counter() - t0
    if plot is not None:
        from oddl.controller.experiments.figures import plan_figure, save

        save(plan_figure(p), plot)
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        click.echo(p.to_json())
    else:
        click.echo("\n".join(p.summary_lines()))
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
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True, max=1e5),
              default=100.0, show_default=True, help="the shared link (model jobs)")
@click.option("--json", "as_json", is_flag=True, help="print score, rotations, shifts_ms")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="PNG: the unified circle, each job's demand as rotated")
def compat(jobs: tuple[str, ...], link_gbps: float, as_json: bool, plot: Path | None
           ) -> None:
    """CASSINI's compatibility of jobs sharing one link: the score, the best rotations on
    the unified circle and the time shifts that realise them."""
    from oddl.controller.registry import profiles_on_a_link
    from oddl.controller.service.compat import compatibility, parse_job, parse_model_job, rolled

    try:
        models = [parse_model_job(j) for j in jobs]
        if all(models):
            seen: dict[str, int] = {}
            named = []
            for model, ranks in models:  # type: ignore[misc]
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
        from oddl.controller.experiments.figures import circle_figure, save

        save(circle_figure([p.name for p in profiles], rolled(profiles, c), c.score,
                           c.perimeter_ms), plot)
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        click.echo(json.dumps({"score": c.score, "rotations": dict(zip(
            (p.name for p in profiles), c.rotations_deg, strict=True)),
            "shifts_ms": dict(zip((p.name for p in profiles), c.shifts_ms, strict=True)),
            "perimeter_ms": c.perimeter_ms}))
        return
    click.echo(f"unified circle: {c.perimeter_ms:g} ms; compatibility score {c.score:.4f}"
               f" ({'compatible' if c.score >= 1 - 1e-9 else 'not compatible'})")
    for p, rot, s in zip(profiles, c.rotations_deg, c.shifts_ms, strict=True):
        click.echo(f"  {p.name}: rotate {rot:.1f} deg = start {s:g} ms later")


def _jobs_report(res: Any, run_dir: Path, backend: str, as_json: bool) -> None:
    """Several jobs: per network JCT summary, per job JCT and queueing (the JCT CDF is in
    the run directory)."""
    if as_json:
        click.echo(json.dumps(res.to_json_obj()))
        return
    nets = list(res.networks)
    t = Table(title=f"{res.experiment}: {len(res.jobs)} jobs ({backend})")
    for col in ("network", "mean JCT", "p99 JCT", "mean queued", "makespan", "utilisation",
                "iterations", "violations"):
        t.add_column(col, justify="left" if col == "network" else "right")
    for n, r in res.networks.items():
        f = r.fabric
        t.add_row(n, f"{f['mean_jct_s']:.3f} s", f"{f['p99_jct_s']:.3f} s",
                  f"{f['mean_queued_s']:.3f} s", f"{f['makespan_s']:.3f} s",
                  f"{f['utilisation']:.1%}", str(r.iterations), str(r.invariant_violations))
    console.print(t)
    jt = Table(title="per job: JCT (queued) / mean iteration")
    jt.add_column("job")
    jt.add_column("nodes", justify="right")
    for n in nets:
        jt.add_column(n, justify="right")
    for job, per in res.jobs.items():
        first = next(iter(per.values()))
        jt.add_row(job, f"{first['nodes']} {first['shape']}", *(
            f"{per[n]['jct_s']:.3f} s ({per[n]['queued_s']:.3f}) / "
            f"{per[n]['iteration_time_s'] * 1e3:.2f} ms" for n in nets))
    console.print(jt)
    console.print(f"invariant violations: {res.invariant_violations}; wall {res.wall_s:.1f} s; "
                  f"results in {run_dir} (jct-cdf.png)")


def _plan_jobs(ctx: Any, strategy: str | None, as_json: bool, plot: Path | None) -> None:
    """`oddl plan --job` for several jobs: each job's partition and plan."""
    from oddl.controller.base.config import NetworkSpec
    from oddl.controller.base.topology import Grid
    from oddl.controller.service.admission import JobRequest, plan_partitions
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
        from oddl.controller.experiments.figures import partition_figure, save

        cells = {grid.coord[n]: part.job for part, _ in plans for n in part.nodes}
        save(partition_figure(f"{ctx.experiment.name} on {tb.name}: the partitions of the "
                              f"jobs that start at once", tb.grid.rows, tb.grid.cols, cells),
             plot)
        click.echo(f"wrote {plot}", err=True)
    if as_json:
        click.echo(json.dumps({"jobs": {p.job: {"partition": {
            "shape": p.shape, "rows": list(p.rows), "cols": list(p.cols),
            "ranks": list(p.ranks), "spare": list(p.spare)}, "plan": plan.to_dict()}
            for p, plan in plans}, "waiting": [r.name for r in waiting]}, indent=1))
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


@main.command()
@click.argument("experiment", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(BACKENDS), default="sim")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="run directory (default: runs/<experiment>-<time>)")
@click.option("--iterations", type=click.IntRange(min=1), default=None,
              help="simulate only N iterations and extrapolate the training time")
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
def run(experiment: Path, backend: str, out: Path | None, iterations: int | None,
        testbed: Path | None, as_json: bool, trace_file: Path | None,
        trace_iterations: int, publish: bool) -> None:
    """Run an experiment: every network on the same workload, results in a run directory."""
    from oddl.controller.experiments.figures import paper_rows
    from oddl.controller.experiments.results import RunDirTaken, make_run_dir
    from oddl.controller.experiments.runner import Timeline
    from oddl.controller.operator import api
    from oddl.controller.service.lock import TestbedBusy
    from oddl.controller.stage1.plan import PlanError

    try:
        ctx = load_experiment(experiment, testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    try:
        run_dir = make_run_dir(out, ctx.experiment.name)
    except RunDirTaken as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    prog = Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=as_json,
                    disable=not err.is_terminal and as_json)
    tasks: dict[str, int] = {}
    last = [0.0]
    timeline = Timeline(trace_iterations) if trace_file is not None else None

    def progress(name: str, done: int, total: int) -> None:
        if name not in tasks:
            tasks[name] = prog.add_task(name, total=total)
        now = time.monotonic()
        if done == total or now - last[0] > 0.1:
            last[0] = now
            prog.update(tasks[name], completed=done)

    try:
        with prog:
            res = api.run(ctx, backend, iterations, run_dir, progress=progress,
                          trace=timeline, publish=publish, say=err.print)
    except TestbedBusy as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(3)
    except PlanError as e:
        click.echo(f"error: {experiment}: networks: cannot be planned: {e}", err=True)
        sys.exit(2)
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
        _jobs_report(res, run_dir, backend, as_json)
        sys.exit(1 if res.invariant_violations else 0)
    paper = paper_rows(ctx.experiment.reference, res.training_min(), res.ratio)
    if as_json:
        click.echo(json.dumps(res.to_json_obj()))
    else:
        t = Table(title=f"{ctx.experiment.name} on {ctx.testbed.name} ({backend})")
        for col in ("network", "training time", "iteration time", "iterations", "flows",
                    "control msgs", "ratio to electrical", "disturbed"):
            t.add_column(col, justify="right" if col != "network" else "left")
        el = next((r for r in res.networks.values() if r.kind == "electrical"), None)
        for r in res.networks.values():
            ratio = f"{r.training_time_s / el.training_time_s:.5f}" if el else "-"
            t.add_row(r.name, f"{r.training_time_s / 60:.2f} min",
                      f"{r.iteration_time_s * 1e3:.4f} ms", str(r.iterations), str(r.flows),
                      str(r.control_messages), ratio,
                      (f"YES: {', '.join(f'{k} {v}' for k, v in r.disturbance.items())}"
                       if r.disturbed else "no"))
        console.print(t)
        faults = [(r.name, f) for r in res.networks.values() for f in r.faults]
        if faults:
            ft = Table(title="faults")
            for col in ("network", "fault", "at", "detected after", "recovered after",
                        "re-plans", "iterations lost", "flows retried"):
                ft.add_column(col, justify="left" if col in ("network", "fault") else "right")

            def ms(ns: int | None) -> str:
                return "-" if ns is None else f"{ns / 1e6:.3f} ms"
            for name, f in faults:
                ft.add_row(name, f"{f['kind']} {f['target']}", ms(f["at_ns"]),
                           ms(f["detected_after_ns"]), ms(f["recovered_after_ns"]),
                           str(f["replans"]), str(f["iterations_lost"]),
                           str(f["flows_retried"]))
            console.print(ft)
        if paper:
            pt = Table(title=f"beside the paper: {ctx.experiment.reference.get('paper', '')}")
            for col in ("figure", "ours", "paper", "difference"):
                pt.add_column(col, justify="left" if col == "figure" else "right")
            for p in paper:
                ours = "-" if p.ours is None else f"{p.ours:.{3 if p.unit else 5}f}"
                pt.add_row(p.what, f"{ours} {p.unit}".strip(), f"{p.paper:g} {p.unit}".strip(),
                           p.difference)
            console.print(pt)
        console.print(res.calibration)
        if res.iterations < res.total_iterations:
            console.print(f"simulated {res.iterations} of {res.total_iterations} iterations; "
                      f"training time extrapolated")
        console.print(f"invariant violations: {res.invariant_violations}; wall {res.wall_s:.1f} s; "
                  f"results in {run_dir}")
    for r in res.networks.values():
        if r.faults:
            click.echo(f"warning: {r.name}: {len(r.faults)} faults during the run: "
                       + "; ".join(f"{f['kind']} {f['target']}" for f in r.faults[:8]),
                       err=True)
        if r.disturbed:
            click.echo(f"warning: {r.name}: the run was disturbed ({r.disturbance}; threshold "
                       f"{ctx.experiment.disturbance_threshold} of {r.control_messages} "
                       f"control messages): its figures are not a clean measurement", err=True)
    if res.invariant_violations:
        sys.exit(1)


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="where to write the emu testbed config (default: <testbed>-emu.toml)")
@click.option("--fault", "faults", multiple=True,
              help=f"{cli_help()} (repeatable)")
@click.option("--external-node", "external", multiple=True,
              help="serve this board without its node program: `oddl node EMU.toml --node "
                   "ID` runs it, as on a lab's host (repeatable)")
@click.option("--spin-us", type=click.FloatRange(min=0), default=2000, show_default=True,
              help="poll instead of sleeping for this long after device activity and "
                   "before a device timer (0: always sleep; docs/emu-run.md)")
def emulate(testbed: Path, out: Path | None, faults: tuple[str, ...],
            external: tuple[str, ...], spin_us: float) -> None:
    """Serve the testbed's devices on 127.0.0.1 (PYNQ.remote, serial ptys, MQTT) until Ctrl-C."""
    import asyncio

    from oddl.sim.emulate import serve
    from oddl.sim.faults import FaultSpecError, parse_fault

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    try:
        parsed = [parse_fault(f, tb) for f in faults]
    except FaultSpecError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if any(f.kind == "broker-restart" for f in parsed):
        click.echo("error: --fault broker-restart: a broker that is down from the start "
                   "serves nobody; drill it while a job runs ([[faults]] in the experiment, "
                   "or POST to the control endpoint: docs/faults.md)", err=True)
        sys.exit(2)
    unknown = sorted(set(external) - {n.id for n in tb.expanded().nodes})
    if unknown:
        click.echo(f"error: --external-node: {', '.join(unknown)} is not a node of {tb.name}",
                   err=True)
        sys.exit(2)
    out = out or Path(f"{testbed.stem}-emu.toml")
    if not out.parent.is_dir():
        click.echo(f"error: --out {out}: directory {out.parent} does not exist", err=True)
        sys.exit(2)
    from oddl.sim.realtime import new_loop

    with asyncio.Runner(loop_factory=lambda: new_loop(spin_us * 1e-6,
                                                      collect_when_idle=True)) as runner:
        runner.run(serve(tb, str(testbed), out, lambda line: click.echo(line), parsed,
                         set(external)))


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--node", "node_id", required=True, help="the node whose O-NIC this runs beside")
@click.option("--irq-pin", default=None,
              help="on the board itself (board = 'local'): the overlay's interrupt pin for "
                   "pynq.Interrupt (default: poll IRQ_STATUS)")
def node(testbed: Path, node_id: str, irq_pin: str | None) -> None:
    """Stage 2 beside one O-NIC: its control units, for every job the controller publishes.

    Runs until Ctrl-C (or SIGTERM, as systemd stops it); docs/deploy.md."""
    import asyncio
    import signal

    from oddl.controller.registry import node_program

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return

    async def serve() -> None:
        try:
            prog = await node_program(tb, node_id, irq_pin=irq_pin).start()
        except Exception as e:  # the board or the broker: say which, exit non-zero
            click.echo(f"error: node {node_id}: {e}", err=True)
            sys.exit(2)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        click.echo(f"node {node_id} of {tb.name}: ready")
        stopped = asyncio.ensure_future(stop.wait())
        serving = asyncio.ensure_future(prog.wait())
        await asyncio.wait({stopped, serving}, return_when="FIRST_COMPLETED")
        if serving.done():  # not asked to stop: it lost the broker (systemd restarts it)
            stopped.cancel()
            click.echo(f"error: node {node_id}: stopped serving: {serving.exception()!r}",
                       err=True)
            sys.exit(1)
        await prog.stop()
        click.echo(f"node {node_id}: stopped after {prog.jobs_run} jobs")

    asyncio.run(serve())


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True,
              help="0: any free port (the URL is printed)")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="listen address; anything but loopback needs --token-file")
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="a file holding the token every request must carry (?token=...)")
def dashboard(testbed: Path, port: int, host: str, token_file: Path | None) -> None:
    """A live web page of the testbed from its MQTT bus: ports, WSS tables, iterations,
    health, faults, the last acceptance result (docs/dashboard.md)."""
    import asyncio
    import signal

    from oddl.controller.operator.dashboard import Dashboard
    from oddl.controller.registry import open_watch

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    token = None
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            click.echo(f"error: --token-file {token_file}: {e.strerror or e}", err=True)
            sys.exit(2)
        if len(token) < 16:
            click.echo(f"error: --token-file {token_file}: a token of 16 characters or more",
                       err=True)
            sys.exit(2)
    try:
        dash = Dashboard(tb, open_watch(tb), host, port, token)
    except (ValueError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)

    async def serve() -> None:
        task = asyncio.ensure_future(dash.serve(
            lambda url: click.echo(f"dashboard of {tb.name}: {url}")))
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception as e:  # the broker or the port: say which
            click.echo(f"error: dashboard: {e}", err=True)
            sys.exit(1)

    asyncio.run(serve())


@main.command("broker-config")
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="directory for mosquitto.conf, passwd, acl and secrets/ (mode 0700)")
@click.option("--port", type=click.IntRange(1, 65535), default=1883, show_default=True)
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="listen address (a lab's broker listens on its control network)")
def broker_config(testbed: Path, out: Path, port: int, bind: str) -> None:
    """Mosquitto's password and access-rule files for a testbed: each party (controller,
    every node, emulator, dashboard) its own password, speaking only as itself."""
    import ipaddress

    from oddl.controller.base.access import write_mosquitto

    try:
        tb = load_testbed(testbed)
        ipaddress.ip_address(bind)
    except ConfigError as e:
        _config_fail(e)
        return
    except ValueError:
        click.echo(f"error: --bind {bind!r} is not an IP address", err=True)
        sys.exit(2)
    try:
        files = write_mosquitto(tb.name, [n.id for n in tb.nodes], out, port, bind)
    except OSError as e:
        click.echo(f"error: --out {out}: {e.strerror or e}", err=True)
        sys.exit(2)
    parties = [k.removeprefix("secrets/") for k in files if k.startswith("secrets/")]
    click.echo(f"{files['mosquitto.conf']}: mosquitto -c {files['mosquitto.conf']}")
    click.echo(f"{len(parties)} parties ({', '.join(parties[:6])}"
               f"{', ...' if len(parties) > 6 else ''}): each one's password in "
               f"{out / 'secrets'}/<party>; give each party only its own "
               f"([broker] password_file or password_env, docs/mqtt.md)")


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["emu", "hw"]), default=None,
              help="emu: start `oddl emulate TESTBED` and accept that; hw: the devices the "
                   "config names (default: emu for a sim testbed, else hw)")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="report directory (default: accept-<testbed>-<time>)")
@click.option("--only", "only", multiple=True,
              help="run only this check (repeatable): reachable, identity, registers, "
                   "tuning, routes, loopback, control-rtt, countaction, lightning")
@click.option("--fault", "faults", multiple=True, help="emu: inject a device fault "
              "(see `oddl emulate --help`)")
@click.option("--wait", "wait_s", type=float, default=0.0,
              help="seconds to wait for a testbed another run holds (default: refuse)")
def accept(testbed: Path, backend: str | None, report: Path | None, only: tuple[str, ...],
           faults: tuple[str, ...], wait_s: float) -> None:
    """Pass or fail a testbed, device by device, with the measured figures."""
    from oddl.controller.operator import accept as acc
    from oddl.controller.operator.session import EmulatorFailed
    from oddl.controller.service.lock import TestbedBusy

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    backend = backend or ("emu" if tb.testbed.backend == "sim" else "hw")
    report = report or Path(f"accept-{tb.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        rc = acc.run(testbed, tb, backend, report, list(only), list(faults), wait_s,
                     lambda line: click.echo(line))
    except (acc.AcceptError, EmulatorFailed, TestbedBusy) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(3 if isinstance(e, TestbedBusy) else 2)
    if backend == "hw" and (report / "summary.json").exists():  # for the lab's dashboard
        # (an emu acceptance runs on a private emulator: nobody watches its bus)
        import msgspec
        from oddl.controller.base.telemetry import accept_note
        from oddl.controller.registry import open_announcer

        note = accept_note(tb.name, json.loads((report / "summary.json").read_text()),
                           time.strftime("%Y-%m-%d %H:%M:%S"))
        try:
            announcer = open_announcer(tb)
            announcer.announce("accept", msgspec.json.encode(note))
            announcer.close()
        except Exception as e:  # the verdict stands; only the dashboard misses it
            click.echo(f"warning: the result was not published on the bus: {e}", err=True)
    sys.exit(rc)


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
    from oddl.controller.experiments.sweep import (
        load_sweep,
        points,
        run_sweep,
        speedups,
        write_outputs,
    )

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

        def progress(row: dict, done: int, total: int) -> None:
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
    t = Table(title=f"{sw.reference} speedup over each network (iteration time)")
    marks = sw.paper_marks()
    for col in ("model", "nodes", "Gb/s", "over", "speedup", "comm only", "paper"):
        t.add_column(col, justify="right" if col not in ("model", "over") else "left")
    for s in speedups(sw, rows):
        v, upto = marks.get(s["over"], (None, False))
        t.add_row(s["model"], str(s["nodes"]), f"{s['line_rate_gbps']:g}", s["over"],
                  f"{s['speedup']:.3f}x",
                  f"{s['comm_speedup']:.3f}x" if s["comm_speedup"] else "-",
                  "-" if v is None else f"{'up to ' if upto else ''}{v:g}x")
    console.print(t)
    bad = sum(r["invariant_violations"] for r in rows)
    click.echo(f"{len(rows)} points in {time.perf_counter() - t0:.1f} s wall; "
               f"invariant violations: {bad}; wrote {', '.join(str(f) for f in files)}")
    if bad:
        sys.exit(1)


@main.command()
@click.option("--a", "a", type=int, default=None, help="operand a, 0..255 (dac_0)")
@click.option("--b", "b", type=int, default=None, help="operand b, 0..255 (dac_1)")
@click.option("--characterize", is_flag=True, help="sweep operand pairs, report accuracy")
@click.option("--samples", type=int, default=4096, help="pairs for --characterize "
              "(65536: all)")
@click.option("--testbed", type=click.Path(path_type=Path), default=None,
              help="a testbed with a [qick] board (its soc and photonics)")
@click.option("--soc", "soc_spec", default=None,
              help="emulated | local | pyro://HOST:PORT/NAME (default: the testbed's, "
                   "else emulated)")
@click.option("--noise", type=float, default=None, help="emulated: noise rms (ADC LSB)")
@click.option("--seed", type=int, default=0, help="emulated noise and --characterize pairs")
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="PNG to write")
@click.option("--json", "as_json", is_flag=True, help="stdout: one JSON object")
def lightning(a: int | None, b: int | None, characterize: bool, samples: int,
              testbed: Path | None, soc_spec: str | None, noise: float | None, seed: int,
              plot: Path | None, as_json: bool) -> None:
    """Lightning's photonic multiply on a QICK board: product = round(a * b / 255)."""
    from oddl.controller.base.config import QickPhotonics
    from oddl.controller.registry import open_soc
    from oddl.drivers import lightning as L
    from pydantic import ValidationError

    qick = None
    if testbed is not None:
        try:
            qick = load_testbed(testbed).qick
        except ConfigError as e:
            _config_fail(e)
            return
        if qick is None:
            click.echo(f"error: {testbed}: no [qick] board in this testbed", err=True)
            sys.exit(2)
    ph_cfg = qick.photonics if qick is not None else QickPhotonics()
    if noise is not None:
        ph_cfg = ph_cfg.model_copy(update={"noise_rms_lsb": noise})
    spec = soc_spec or (qick.soc if qick is not None else "emulated")
    chans = {"dac_channels": qick.dac_channels, "adc_channel": qick.adc_channel} \
        if qick is not None else {}
    try:
        soc, soccfg = open_soc(spec, ph_cfg, seed)
        if characterize:
            pairs = L.operand_pairs(samples, seed)
            base = L.LightningConfig(dac_0=0, dac_1=0, **chans)
            rep = L.characterize(soc, soccfg, pairs, base)
            if plot is not None:
                L.plot_accuracy(pairs, rep["errors"], plot)
            rep = {k: v for k, v in rep.items() if k != "errors"}
            rep |= {"soc": spec, "published_accuracy": 0.9925}
            if as_json:
                click.echo(json.dumps(rep))
                return
            click.echo(f"{rep['pairs']} operand pairs on {spec} in {rep['wall_s']:.1f} s "
                       f"({rep['pairs_per_s']:.0f}/s)")
            click.echo(f"accuracy as Lightning measures it (100 - 100 RMSE, normalised): "
                       f"{rep['rmse_accuracy']:.2f}% (published: 99.25%)")
            click.echo(f"exact: {100 * rep['exact']:.2f}%; within 1 LSB: "
                       f"{100 * rep['within_1_lsb']:.2f}%")
            click.echo(f"mean |error| {rep['mean_abs_error_lsb']:.4f} LSB; worst "
                       f"{rep['worst_error_lsb']} LSB at a, b = {rep['worst_pair']}"
                       + (f"; no output: {rep['no_output']}" if rep["no_output"] else ""))
            return
        if a is None or b is None:
            click.echo("error: give --a and --b (or --characterize)", err=True)
            sys.exit(2)
        cfg = L.LightningConfig(dac_0=a, dac_1=b, **chans)
        prod, wave = L.multiply(soc, soccfg, cfg)
    except ValidationError as e:
        for er in e.errors():
            loc = ".".join(str(x) for x in er["loc"])
            name = {"dac_0": "--a", "dac_1": "--b"}.get(loc, loc)
            click.echo(f"error: {name}: {er['msg']}", err=True)
        sys.exit(2)
    except (ValueError, L.NoOutput) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1 if isinstance(e, L.NoOutput) else 2)
    if plot is not None:
        L.LightningSignalProcessing(soccfg, cfg).plot_waveform(wave, plot)
    d = prod.as_dict() | {"soc": spec}
    if as_json:
        click.echo(json.dumps(d))
        return
    click.echo(f"{a} x {b} / 255 = {prod.product}  (exact: {d['expected']}; decoded "
               f"{d['raw_product']:.3f}, fraction {d['decoded_fraction']:.6f})")
    click.echo("levels (ADC): " + ", ".join(f"{k} {v:.1f}" for k, v in prod.levels.items()))


@main.group()
def countaction() -> None:
    """Count-action programs for the O-NIC engine (Lightning's abstraction)."""


def _parse_params(params: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for p in params:
        k, _, v = p.partition("=")
        if not re.fullmatch(r"[0-9]{1,18}", v.strip()):
            raise click.BadParameter(f"{p!r}: use NAME=INTEGER", param_hint="--param")
        out[k.strip()] = int(v)
    return out


def _board_params(testbed: Path) -> dict[str, int]:
    """What the target board knows of itself: num_DACs, its QICK board's generators."""
    from oddl.controller.registry import open_soc

    tb = load_testbed(testbed)
    if tb.qick is None:
        raise click.BadParameter(f"{testbed}: no [qick] board to take num_DACs from; give "
                                 "--param num_DACs=N", param_hint="--testbed")
    _soc, soccfg = open_soc(tb.qick.soc, tb.qick.photonics)
    return {"num_DACs": len(soccfg["gens"])}


def _load_program(file: Path, params: tuple[str, ...], testbed: Path | None = None,
                  free: bool = False):  # type: ignore[no-untyped-def]
    """(program, free parameters): the board's values where the program uses them, then
    --param's over them; free parameters are an error unless `free`."""
    from oddl.fpga.countaction import CountActionError, parse, parse_template

    try:
        text, given = file.read_text(), _parse_params(params)
        if testbed is not None:  # bind what the program leaves free, from the board
            _prog, unbound = parse_template(text, given, str(file))
            board = _board_params(testbed)
            given = {**{k: board[k] for k in unbound if k in board}, **given}
        if free:
            return parse_template(text, given, str(file))
        return parse(text, given, str(file)), []
    except OSError as e:
        click.echo(f"error: {file}: {e.strerror}", err=True)
        sys.exit(2)
    except CountActionError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except ConfigError as e:
        _config_fail(e)
        sys.exit(2)


PARAM_HELP = "NAME=VALUE for a program parameter"
TESTBED_HELP = "bind num_DACs from this testbed's QICK board (its generator count)"


@countaction.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--param", "params", multiple=True, help=PARAM_HELP)
def ca_check(file: Path, params: tuple[str, ...]) -> None:
    """Parse and check a program, listing the parameters it leaves free; errors give
    file:line:column."""
    prog, free = _load_program(file, params, free=True)
    bound = ", ".join(f"{k} = {v}" for k, v in prog.params.items())
    n = len(prog.modules)
    click.echo(f"OK {file}: {n} module{'' if n == 1 else 's'} "
               f"({', '.join(m.name for m in prog.modules)})"
               + (f"; bound: {bound}" if bound else "")
               + (f"; free parameters: {', '.join(free)}" if free else ""))


@countaction.command("compile")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--param", "params", multiple=True, help=PARAM_HELP)
@click.option("--testbed", type=click.Path(path_type=Path), default=None, help=TESTBED_HELP)
@click.option("--json", "as_json", is_flag=True, help="the image as JSON (default: a table)")
def ca_compile(file: Path, params: tuple[str, ...], testbed: Path | None,
               as_json: bool) -> None:
    """Compile to the register image of the O-NIC count-action engine."""
    from oddl.fpga import regmap as R
    from oddl.fpga.countaction import compile_program, image_writes

    img = compile_program(_load_program(file, params, testbed)[0])
    if as_json:
        click.echo(json.dumps(img, indent=1))
        return
    if img["params"]:
        click.echo("# " + ", ".join(f"{k} = {v}" for k, v in img["params"].items()))
    for off, val in image_writes(img):
        click.echo(f"0x{off:04X} {R.BY_OFFSET[off].name:<14} 0x{val:08X}")


@countaction.command("decompile")
@click.argument("image", type=click.Path(path_type=Path))
def ca_decompile(image: Path) -> None:
    """Turn a register image (JSON) back into count-action text."""
    from oddl.fpga.countaction import CountActionError, decompile

    try:
        click.echo(decompile(json.loads(image.read_text())).text(), nl=False)
    except (OSError, ValueError, RecursionError, CountActionError) as e:
        click.echo(f"error: {image}: {e}", err=True)
        sys.exit(2)


@main.group()
def optinc() -> None:
    """OptINC (seeds/004): gradients averaged by an optical neural network in flight."""


@optinc.command("train")
@click.option("--servers", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("--ports", type=click.IntRange(2, 64), default=32, show_default=True,
              help="servers one unit averages; more servers make a two-level cascade")
@click.option("--epochs", type=click.IntRange(1, 1000), default=30, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--ideal", is_flag=True, help="ideal components (no DAC rounding, noise, loss)")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="accuracy per epoch, exact and optical, as a PNG")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def optinc_train(servers: int, ports: int, epochs: int, seed: int, ideal: bool,
                 plot: Path | None, as_json: bool) -> None:
    """Data-parallel SGD on scikit-learn's digits: exact vs optical gradient averaging."""
    from oddl.sim.mzi import Components
    from oddl.sim.onn import CHIP
    from oddl.sim.training import compare

    comp = Components() if ideal else CHIP
    try:
        ex, op, fabric = compare(servers, comp, ports, epochs, seed)
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    out = {"servers": servers, "levels": fabric.levels, "epochs": epochs, "seed": seed,
           "exact_accuracy": ex.final, "optical_accuracy": op.final,
           "exact_curve": ex.accuracy, "optical_curve": op.accuracy,
           "replica_drift": op.drift[-1], "matrix_error": fabric.matrix_error,
           "components": asdict(comp)}
    if plot is not None:
        _plot_curves(plot, ex.accuracy, op.accuracy, servers)
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{servers} servers ({' x '.join(map(str, fabric.levels))}), {epochs} epochs: "
               f"test accuracy exact {ex.final:.4f}, optical {op.final:.4f} "
               f"(replicas apart by at most {op.drift[-1]:.2g}; chip matrix error "
               f"{fabric.matrix_error:.2g})")


def _plot_curves(path: Path, exact: list[float], optical: list[float], servers: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ep = range(1, len(exact) + 1)
    ax.plot(ep, exact, label="exact mean (ring all-reduce)")
    ax.plot(ep, optical, label="OptINC (quantised, noisy, calibrated)", linestyle="--")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"digits, {servers} servers")
    ax.ticklabel_format(useOffset=False)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@optinc.command("mesh")
@click.option("--size", type=click.IntRange(2, 32), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def optinc_mesh(size: int, seed: int, as_json: bool) -> None:
    """Decompose a random unitary into an MZI mesh and back; average `size` servers on a
    calibrated chip."""
    import numpy as np
    from oddl.sim.mzi import decompose
    from oddl.sim.onn import CHIP, OptINC
    from scipy.stats import unitary_group

    u = unitary_group.rvs(size, random_state=seed)
    mesh = decompose(u)
    fabric = OptINC(size, size, CHIP, seed)
    unit = fabric.units[0]
    x = np.random.default_rng(seed).uniform(-1, 1, (size, 4096))
    avg_err = float(np.abs(fabric.average(x, 1.0) - x.mean(axis=0)).max())
    out = {"size": size, "mzis": len(mesh.mzis), "depth": mesh.depth,
           "decomposition_error": float(np.abs(mesh.matrix() - u).max()),
           "matrix_error_uncalibrated": unit.error_before,
           "matrix_error_calibrated": unit.error_after,
           "averaging_error": avg_err, "lsb": 1 / (2 ** (CHIP.output_bits - 1) - 1)}
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"{size} x {size} unitary: {out['mzis']} MZIs, depth {out['depth']}, "
               f"rebuilt to {out['decomposition_error']:.1e}")
    click.echo(f"averaging chip: matrix error {unit.error_before:.2e} uncalibrated, "
               f"{unit.error_after:.2e} calibrated; average of {size} servers within "
               f"{avg_err:.4f} of full scale (1 LSB = {out['lsb']:.4f})")


@main.command()
def regmap() -> None:
    """Print the O-NIC register map as a markdown table."""
    from oddl.fpga import regmap as R

    click.echo(R.markdown(), nl=False)


if __name__ == "__main__":
    main()
