"""What `oddl run` prints: the networks' figures, the faults, the paper's beside ours,
the host's load, and the warnings a run's reader must not miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from oddl.app.cli.main import console, emit
from rich.table import Table


def jobs_report(res: Any, run_dir: Path, backend: str, as_json: bool) -> None:
    """Several jobs: per network JCT summary, per job JCT and queueing (the JCT CDF is in
    the run directory)."""
    if as_json:
        emit(res.to_json_obj())
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


def run_report(res: Any, ctx: Any, backend: str, run_dir: Path) -> None:
    """`oddl run`'s tables: every network's figures, the faults, the paper's beside ours;
    how compute was found, the hosts' load, the first violations."""
    from oddl.app.experiments.figures import paper_rows

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
    faults_table(res)
    paper = paper_rows(ctx.experiment.reference, res.training_min(), res.ratio)
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
    for r in res.networks.values():  # a real-time run: how loaded its hosts were
        if (lag := r.stats.get("loop_lag_ms")) is not None:
            console.print(f"{r.name}: loops ran up to {lag['controller']:.1f} ms late "
                          f"(controller), {lag['nodes']:.1f} ms (node programs)" + (
                              ": a loaded host, its figures are skewed"
                              if "host_lag_ms" in r.disturbance else ""))
    if res.iterations < res.total_iterations:
        console.print(f"simulated {res.iterations} of {res.total_iterations} iterations; "
                      f"training time extrapolated")
    for r in res.networks.values():
        if r.steady:
            console.print(f"{r.name}: {r.steady['simulated']} iterations simulated, then "
                          f"{r.steady['copies']:,} copies of the last, which repeats exactly "
                          f"(every {r.steady['period_ns'] / 1e6:.6f} ms; --every-iteration "
                          f"simulates them)")
    console.print(f"invariant violations: {res.invariant_violations}; wall {res.wall_s:.1f} s; "
                  f"results in {run_dir}")
    for v in res.violations[:5]:  # the first ones, each with its job (summary.json: 50)
        console.print(f"  {v}", highlight=False)


def faults_table(res: Any) -> None:
    faults = [(r.name, f) for r in res.networks.values() for f in r.faults]
    if not faults:
        return
    ft = Table(title="faults")
    for col in ("network", "fault", "at", "detected after", "recovered after",
                "re-plans", "iterations lost", "flows retried"):
        ft.add_column(col, justify="left" if col in ("network", "fault") else "right")

    def ms(ns: int | None) -> str:
        return "-" if ns is None else f"{ns / 1e6:.3f} ms"
    for name, f in faults:
        ft.add_row(name, f"{f['kind']} {f['target']}", ms(f["at_ns"]),
                   ms(f["detected_after_ns"]), ms(f["recovered_after_ns"]),
                   str(f["replans"]), str(f["iterations_lost"]), str(f["flows_retried"]))
    console.print(ft)


def run_warnings(res: Any, ctx: Any) -> None:
    """On stderr: the faults a run met, and a disturbed run's figures are not clean."""
    for r in res.networks.values():
        if r.faults:
            click.echo(f"warning: {r.name}: {len(r.faults)} faults during the run: "
                       + "; ".join(f"{f['kind']} {f['target']}" for f in r.faults[:8]),
                       err=True)
        late = [f"{f['kind']} {f['target']}" for f in r.faults if f["recovered"] is None]
        if late:
            click.echo(f"warning: {r.name}: {'; '.join(late[:8])} reached the testbed only "
                       f"after the run's last iteration had ended: it tested nothing "
                       f"(recovered: null; a drill on a loaded host: run more iterations)",
                       err=True)
        if r.disturbed:
            click.echo(f"warning: {r.name}: the run was disturbed ({r.disturbance}; threshold "
                       f"{ctx.experiment.disturbance_threshold} of {r.control_messages} "
                       f"control messages): its figures are not a clean measurement", err=True)
