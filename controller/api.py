"""oddl's public API, for scripts and notebooks (docs/api.md has a worked example).

    from oddl.controller import api

    ctx = api.load_experiment("experiments/table1-resnet50.toml")
    result = api.run(ctx, iterations=50, out="runs/t1")   # or: await api.run_async(...)
    print(result.ratio, api.read_run("runs/t1")["networks"]["oddl"]["iterations"][0])

Everything here is data in, data out: configs are pydantic models, a plan is a `Plan`
(printable, diffable, JSON), a run is a `RunResult` plus a run directory that
`read_run` reads back. The names below are kept stable; anything else may change.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from oddl.controller.collectives import build
from oddl.controller.config import (
    ConfigError,
    LoadedExperiment,
    Testbed,
    load_experiment,
    load_testbed,
)
from oddl.controller.plan import Plan
from oddl.controller.planner import plan_job
from oddl.controller.results import RunStore, make_run_dir, read_store, write_manifest
from oddl.controller.runner import NetworkRun, RunFailed, RunResult, run_experiment
from oddl.controller.topology import Grid
from oddl.controller.workloads import model_spec

__all__ = ["ConfigError", "LoadedExperiment", "NetworkRun", "Plan", "RunFailed",
           "RunResult", "Testbed", "grid_testbed", "load_experiment", "load_testbed",
           "network_run", "plan",
           "read_run", "run", "run_async"]


def grid_testbed(rows: int, cols: int, wavelengths: int | None = None,
                 control: dict[str, Any] | None = None, **optical: Any) -> Testbed:
    """A generated rows x cols testbed (a WSS per row and column, nodes n{row}-{col}, a
    50 GHz grid of `wavelengths`, default one less than the larger side), for studies at
    any size; `optical` and `control` override the config's sections (control default:
    the prototype's 1 us FPGA network)."""
    w = wavelengths if wavelengths is not None else max(rows, cols, 2) - 1
    return Testbed.model_validate({
        "testbed": {"name": f"t{rows}x{cols}"},
        "grid": {"rows": rows, "cols": cols},
        "optical": {"line_rate_gbps": 100, "tuning_time_ns": 10.5,
                    "wavelength_grid": {"start_nm": 1530.33, "spacing_ghz": 50, "count": w},
                    **optical},
        "control": {"latency_ns": 1000, **(control or {})},  # the prototype's FPGA network
        "generate": {"nodes": "n{row}-{col}", "wss": True},
    }).expanded()


def plan(testbed: Testbed | str | Path, experiment: LoadedExperiment | None = None,
         strategy: str | None = None) -> Plan:
    """Stage 1's plan for an experiment's workload on a testbed (default: halving-doubling
    of ResNet-50 over every node), validated; nothing is applied."""
    tb = testbed if isinstance(testbed, Testbed) else load_testbed(testbed)
    if experiment is not None:
        w = experiment.workload
        nets = [s for s in experiment.experiment.networks if s.kind == "oddl"]
        strat = strategy or (nets[0].strategy if nets else "matched")
        model, coll, bpp, name = w.model, w.collective, w.bytes_per_param, \
            experiment.experiment.name
    else:
        strat, model, coll, bpp, name = strategy or "matched", "resnet50", "hd", 4, "hd-all"
    grid = Grid.from_testbed(tb)
    sched = build(coll, tb.n_nodes, model_spec(model).grad_bytes(bpp), tb.grid.rows,
                  tb.grid.cols)
    p = plan_job(tb, grid, sched, name, strat)
    p.validate(grid)
    return p


def run(experiment: LoadedExperiment | str | Path, backend: str = "sim",
        iterations: int | None = None, out: str | Path | None = None) -> RunResult:
    """Run every network of an experiment (`oddl run`); with `out`, into a run directory
    (manifest, results.sqlite with every iteration, summary.json)."""
    ctx = experiment if isinstance(experiment, LoadedExperiment) else \
        load_experiment(experiment)
    if out is None:
        return run_experiment(ctx, backend, None, iterations)
    run_dir = make_run_dir(Path(out), ctx.experiment.name)
    write_manifest(run_dir, {"experiment": ctx.path, "testbed": ctx.testbed_path},
                   {"seed": ctx.experiment.seed, "backend": backend,
                    "experiment": ctx.experiment.model_dump()})
    store = RunStore(run_dir / "results.sqlite")
    try:
        res = run_experiment(ctx, backend, store, iterations)
    finally:
        store.close()
    res.run_dir = str(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(res.to_json_obj(), indent=1))
    return res


async def run_async(experiment: LoadedExperiment | str | Path, backend: str = "sim",
                    iterations: int | None = None, out: str | Path | None = None
                    ) -> RunResult:
    """`run` from a running event loop (a notebook's): the sim back end keeps its own
    virtual clock, so the run goes to a worker thread and your loop stays responsive."""
    return await asyncio.to_thread(run, experiment, backend, iterations, out)


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """A run directory: its manifest, summary and every recorded iteration (per network)."""
    d = Path(run_dir)
    summary = d / "summary.json"
    return {"manifest": json.loads((d / "manifest.json").read_text()),
            "summary": json.loads(summary.read_text()) if summary.exists() else None,
            "networks": read_store(d / "results.sqlite")}


def network_run(ctx: LoadedExperiment, network: str, backend: str = "sim",
                checker_mode: str = "raise") -> NetworkRun:
    """One network of an experiment, stage 1 applied, ready to `run(...)` (benchmarks)."""
    spec = next((s for s in ctx.experiment.networks if s.name == network), None)
    if spec is None:
        raise ValueError(f"{ctx.experiment.name} has no network {network!r}")
    w, tb = ctx.workload, ctx.testbed
    sched = build(spec.collective or w.collective, tb.n_nodes,
                  model_spec(w.model).grad_bytes(w.bytes_per_param), tb.grid.rows,
                  tb.grid.cols, spec.degree, spec.bidirectional)
    return NetworkRun(ctx, spec, Grid.from_testbed(tb), sched, backend, checker_mode)

