"""`oddl sweep`: networks x models x node counts x line rates, one table, the speedup plots.

Every point is one network running one iteration of one model's all-reduce on a generated
testbed of N nodes at one line rate, through the same runner as `oddl run` (the ODDL
points through the control units and the emulated boards, the baselines through their
flow-level models). Points are independent, so they run in a process pool or, with
`--cluster`, on a Dask distributed cluster: the same task function either way.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from oddl.controller.base.catalog import MODELS, CollectiveName, ModelName
from oddl.controller.base.config import (
    ConfigError,
    ConfigIssue,
    ConfigModel,
    Experiment,
    LoadedExperiment,
    NetworkSpec,
    Testbed,
    domain_issues,
    load_testbed,
    pydantic_issues,
    read_toml,
    validate_experiment,
)
from oddl.controller.base.config.experiment import DeviceName
from oddl.controller.base.extras import require
from oddl.controller.base.layers import layer_models
from oddl.controller.serving.lifecycle import as_stopped
from pydantic import Field, ValidationError, model_validator


class Sweep(ConfigModel):
    name: str = Field(min_length=1)
    description: str = ""
    testbed: str = Field(description="template testbed; its grid is resized per node count")
    models: list[ModelName] = Field(min_length=1)
    nodes: list[int] = Field(min_length=1)
    line_rates_gbps: list[float] = Field(min_length=1)
    collective: CollectiveName = "hd"
    compute_time_ms: dict[str, float] = Field(
        default_factory=dict, description="per model; absent = 0 (communication only)")
    device: DeviceName | None = Field(
        default=None, description="compute from each model's layer table on this device, "
                                  "at batch_per_node (not with compute_time_ms)")
    batch_per_node: int = Field(default=32, gt=0, le=1 << 16)
    overlap: bool = Field(default=False, description="DDP's buckets overlap backward")
    reference: str = Field(default="oddl", description="the network the speedups are of")
    networks: list[NetworkSpec] = Field(min_length=1)
    papers: dict[str, Any] = Field(
        default_factory=dict, description="the papers' figures; `<reference>_over_<network>` "
        "(or `..._max`, an 'up to') is drawn on the speedup plots and printed beside ours")

    @model_validator(mode="after")
    def _check(self) -> Sweep:
        names = [n.name for n in self.networks]
        if len(set(names)) != len(names):
            raise ValueError(f"network names must be unique, got {names}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not one of {names}")
        for n in self.nodes:
            if n < 2 or n & (n - 1):
                raise ValueError(f"node count {n}: a power of two >= 2 (the grid and HD "
                                 f"need it)")
        for m in self.compute_time_ms:
            if m not in MODELS:
                raise ValueError(f"compute_time_ms: unknown model {m!r}")
        if self.device is not None and self.compute_time_ms:
            raise ValueError("give one of compute_time_ms or device")
        if self.device is not None or self.overlap:
            missing = [m for m in self.models if m not in layer_models()]
            if missing:
                raise ValueError(f"{'overlap' if self.overlap else 'device'}: no layer table "
                                 f"for {', '.join(missing)}")
        for k, v in self.papers.items():
            if k.startswith(f"{self.reference}_over_") and (
                    isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
                raise ValueError(f"papers.{k}: a speedup, a number > 0 (got {v!r})")
        for over in self.paper_marks():
            if over not in names:
                raise ValueError(f"papers.{self.reference}_over_{over}: no network {over!r} "
                                 f"(networks: {names})")
        return self

    def paper_marks(self) -> dict[str, tuple[float, bool]]:
        """over -> (the paper's speedup of the reference over it, whether it is an 'up to')."""
        pre = f"{self.reference}_over_"
        return {k.removeprefix(pre).removesuffix("_max"): (float(v), k.endswith("_max"))
                for k, v in self.papers.items() if k.startswith(pre)}


def load_sweep(path: str | Path) -> tuple[Sweep, Path]:
    """A sweep and its template testbed, every point validated as `oddl run` validates an
    experiment (`validate_experiment`), before any runs: ConfigError with every issue of
    every point, each naming the point (a point then fails only in what only running it
    finds, such as a plan)."""
    path = Path(path)
    try:
        sw = Sweep.model_validate(read_toml(path))
    except ValidationError as e:
        raise ConfigError(pydantic_issues(path, e)) from None
    tb = (path.parent / sw.testbed) if not Path(sw.testbed).is_absolute() else Path(sw.testbed)
    if not tb.exists():
        raise ConfigError([ConfigIssue(str(path), "testbed", f"no such file: {tb}")])
    load_testbed(tb)  # the template's own mistakes, named in its file
    issues = _point_issues(path, sw, read_toml(tb))
    if issues:
        raise ConfigError(issues)
    return sw, tb


def _point_issues(path: Path, sw: Sweep, template: dict[str, Any]) -> list[ConfigIssue]:
    """Every point's experiment on its generated testbed, validated; an issue of a point's
    network is said once, at that network's place in the sweep, with the points it is
    true of."""
    testbeds: dict[tuple[int, float], Testbed | None] = {}
    found: dict[tuple[str, str], list[str]] = {}
    index = {n.name: i for i, n in enumerate(sw.networks)}
    for p in points(sw):
        shape = (p["nodes"], p["line_rate_gbps"])
        if shape not in testbeds:
            try:
                testbeds[shape] = make_testbed(template, *shape)
            except ValueError as e:
                testbeds[shape] = None
                found.setdefault(("nodes", str(e)), [])
        tb = testbeds[shape]
        if tb is None:
            continue
        try:
            validate_experiment(path, point_experiment(_task(sw, p)), tb)
        except ConfigError as e:
            where = f"networks[{index[p['network']['name']]}]"
            for x in e.issues:
                field = x.path.replace("networks[0]", where) if x.path.startswith(
                    "networks[0]") else f"{where} ({x.path})"
                found.setdefault((field, x.reason), []).append(_name(_key(p)))
    return [ConfigIssue(str(path), field, reason + (f" (at {', '.join(at[:4])}"
                                                    f"{' and more' * (len(at) > 4)})"
                                                    if at else ""))
            for (field, reason), at in found.items()]


def grid_shape(n: int) -> tuple[int, int]:
    rows = 1 << (int(math.log2(n)) // 2)
    return rows, n // rows


def points(sw: Sweep) -> list[dict[str, Any]]:
    """The cross product, largest first (the pool then finishes sooner)."""
    out = [{"network": net.model_dump(), "model": m, "nodes": n, "line_rate_gbps": r}
           for net in sw.networks for m in sw.models for n in sw.nodes
           for r in sw.line_rates_gbps]
    return sorted(out, key=lambda p: -p["nodes"])


def make_testbed(template: dict[str, Any], n: int, rate: float) -> Testbed:
    rows, cols = grid_shape(n)
    d = json.loads(json.dumps(template))
    d["testbed"]["name"] = f"{d['testbed']['name']}-{n}-{rate:g}G"
    d["grid"] = {"rows": rows, "cols": cols}
    d["optical"]["line_rate_gbps"] = rate
    d["nodes"], d["wss"] = [], []
    d["generate"] = {"nodes": "n{row}-{col}", "wss": True}
    tb = Testbed.model_validate(d).expanded()
    issues = domain_issues(tb)
    if issues:
        raise ValueError(f"generated testbed for {n} nodes: {issues[0]}")
    return tb


class PointFailed(RuntimeError):
    pass


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """One sweep point; plain data in and out (process pools and Dask ship it as is).
    A failure names the point."""
    try:
        return _run_point(task)
    except Exception as e:
        net = task["network"]["name"]
        raise PointFailed(f"{net} {task['model']} {task['nodes']} nodes "
                          f"{task['line_rate_gbps']:g} Gb/s: {type(e).__name__}: {e}") from e


def _task(sw: Sweep, p: dict[str, Any]) -> dict[str, Any]:
    """A point with what running it needs of its sweep (but the template testbed)."""
    return {**p, "sweep": sw.name, "collective": sw.collective,
            "compute_time_ms": sw.compute_time_ms.get(p["model"], 0.0),
            "device": sw.device, "overlap": sw.overlap, "batch_per_node": sw.batch_per_node}


def point_experiment(task: dict[str, Any]) -> Experiment:
    """A point as the one-iteration experiment it runs."""
    net = NetworkSpec.model_validate(task["network"])
    return Experiment.model_validate({
        "name": f"{task['sweep']}-{net.name}", "testbed": "<generated>", "iterations": 1,
        "flow_records": "none", "networks": [net.model_dump()],
        "workload": {"model": task["model"], "collective": task["collective"], "epochs": 1,
                     "dataset_samples": 1_281_167,
                     "batch_per_node": task.get("batch_per_node", 32),
                     "overlap": task.get("overlap", False),
                     **({"device": task["device"]} if task.get("device") else
                        {"compute_time_ms": task.get("compute_time_ms", 0.0)})}})


def _run_point(task: dict[str, Any]) -> dict[str, Any]:
    from oddl.app.experiments.runner import run_experiment

    t0 = time.perf_counter()
    net = NetworkSpec.model_validate(task["network"])
    tb = make_testbed(task["template"], task["nodes"], task["line_rate_gbps"])
    ctx = LoadedExperiment(Path("<sweep>"), point_experiment(task), Path("<generated>"), tb)
    run = run_experiment(ctx)
    res = run.networks[net.name]
    compute = run.compute_ns / 1e6  # (with overlap, comm_ms is what backward left exposed)
    it_ms = res.iteration_time_s * 1e3
    return {"network": net.name, "kind": net.kind, "model": task["model"],
            "nodes": task["nodes"], "line_rate_gbps": task["line_rate_gbps"],
            "collective": net.collective or task["collective"],
            "iteration_ms": round(it_ms, 6), "comm_ms": round(it_ms - compute, 6),
            "flows": res.flows, "control_messages": res.control_messages,
            "control_msgs_per_node": round(res.control_messages / task["nodes"], 3),
            "plan_ms": round(res.stats["plan_s"] * 1e3, 3) if "plan_s" in res.stats else None,
            "invariant_violations": res.invariant_violations,
            "wall_s": round(time.perf_counter() - t0, 3)}


def _local(tasks: list[dict[str, Any]], jobs: int) -> Iterator[dict[str, Any]]:
    """The points in this process (`jobs` 1) or in a pool of `jobs` processes. A stop
    (Ctrl-C, SIGTERM) ends the pool at once: its workers are deaf to the terminal's
    signals (no traceback of theirs), and the points they run are cut (killed), not
    waited for."""
    if jobs <= 1:
        for t in tasks:
            yield run_point(t)
        return
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    from oddl.controller.serving.lifecycle import deaf

    ex = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=deaf)
    futs: dict[Future[dict[str, Any]], dict[str, Any]] = {}
    try:
        futs.update({ex.submit(run_point, t): t for t in tasks})
        while futs:
            done, _ = wait(futs, return_when=FIRST_COMPLETED)
            for f in done:
                del futs[f]
                yield f.result()
    finally:
        if futs:  # stopped, or a point failed: the rest are cut, not waited for
            for p in list(getattr(ex, "_processes", {}).values()):  # (3.11 has no public
                p.kill()  # way to end a pool's workers; deaf ones ignore SIGTERM)
        ex.shutdown(wait=True, cancel_futures=True)


def _dask(tasks: list[dict[str, Any]], address: str) -> Iterator[dict[str, Any]]:
    """The points on a Dask cluster; a stop cancels those not done."""
    require("cluster", "oddl sweep --cluster")
    from distributed import Client, as_completed

    with Client(address) as client:
        futs = client.map(run_point, tasks, pure=False)
        try:
            for f in as_completed(futs):
                yield f.result()
        finally:
            client.cancel([f for f in futs if not f.done()])


def run_sweep(sw: Sweep, testbed_path: Path, jobs: int = 1, cluster: str | None = None,
              progress: Callable[[dict[str, Any], int, int], None] | None = None,
              journal: Path | None = None) -> list[dict[str, Any]]:
    """All points; each completed row is appended to `journal` (JSON lines) as it arrives,
    so a sweep that fails or is killed keeps every point it finished, and a rerun into the
    same directory runs only the points the journal does not have."""
    template = read_toml(testbed_path)
    todo = points(sw)
    wanted = {_key(p) for p in todo}
    rows = [r for r in _journal(journal) if _key(r) in wanted]
    have = {_key(r) for r in rows}
    tasks = [{**_task(sw, p), "template": template} for p in todo if _key(p) not in have]
    total = len(tasks) + len(rows)
    it = _dask(tasks, cluster) if cluster else _local(tasks, jobs)
    try:
        for row in it:
            rows.append(row)
            if journal is not None:
                journal.parent.mkdir(parents=True, exist_ok=True)
                with journal.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            if progress is not None:
                progress(row, len(rows), total)
    except KeyboardInterrupt as e:  # a stop: say what is kept and what was cut
        got = {_key(r) for r in rows}
        cut = [_key(p) for p in todo if _key(p) not in got]
        stop = as_stopped(e)
        kept = f"{len(rows)} of {total} points kept" + (f" in {journal}" if journal else "")
        if cut:
            kept += (f"; {len(cut)} cut: {', '.join(_name(k) for k in cut[:8])}"
                     + (f" and {len(cut) - 8} more" if len(cut) > 8 else ""))
            if journal is not None:
                kept += f" (the same --out {journal.parent} runs only those)"
        stop.notes.append(kept)
        raise stop from None
    order = {n.name: i for i, n in enumerate(sw.networks)}
    rows.sort(key=lambda r: (r["model"], r["nodes"], r["line_rate_gbps"], order[r["network"]]))
    return rows


def _name(k: tuple[str, str, int, float]) -> str:
    return f"{k[0]} {k[1]} {k[2]}n {k[3]:g}G"


def _key(p: dict[str, Any]) -> tuple[str, str, int, float]:
    net = p["network"]["name"] if isinstance(p["network"], dict) else p["network"]
    return (net, p["model"], int(p["nodes"]), float(p["line_rate_gbps"]))


def _journal(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a line cut off by a kill: the point reruns
    return out


def speedups(sw: Sweep, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, nodes, rate): the reference network's speedup over every other one
    (their iteration time / the reference's)."""
    by = {(r["model"], r["nodes"], r["line_rate_gbps"], r["network"]): r for r in rows}
    out = []
    for (m, n, rate, net), r in by.items():
        ref = by.get((m, n, rate, sw.reference))
        if net == sw.reference or ref is None:
            continue
        out.append({"model": m, "nodes": n, "line_rate_gbps": rate, "over": net,
                    "speedup": round(r["iteration_ms"] / ref["iteration_ms"], 4),
                    "comm_speedup": round(r["comm_ms"] / ref["comm_ms"], 4)
                    if ref["comm_ms"] > 0 else None})
    return sorted(out, key=lambda s: (s["model"], s["over"], s["nodes"], s["line_rate_gbps"]))


def write_outputs(sw: Sweep, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    sp = speedups(sw, rows)
    files = []
    for name, data in (("results.csv", rows), ("speedups.csv", sp)):
        if data:
            with (out / name).open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(data[0]))
                w.writeheader()
                w.writerows(data)
            files.append(out / name)
    (out / "results.json").write_text(json.dumps(
        {"sweep": sw.model_dump(), "results": rows, "speedups": sp}, indent=1) + "\n")
    files.append(out / "results.json")
    files += _plots(sw, sp, out)
    return files


def _plots(sw: Sweep, sp: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    marks = sw.paper_marks()
    colour = {over: f"C{i}" for i, over in enumerate(sorted({s["over"] for s in sp}))}

    def mark(ax: Any, over: str) -> None:
        if over in marks:
            v, upto = marks[over]
            ax.axhline(v, color=colour[over], ls="--", lw=1,
                       label=f"paper: {'up to ' if upto else ''}{v:g}x over {over}")

    if sp and all(len({s[k] for s in sp}) < 2 for k in ("nodes", "line_rate_gbps")):
        # one point per model: bars, the papers' figures as marks on them
        fig, axes = plt.subplots(1, len(sw.models), figsize=(5 * len(sw.models), 3.8),
                                 squeeze=False)
        for ax, m in zip(axes[0], sw.models, strict=True):
            pts = sorted((s["over"], s["speedup"]) for s in sp if s["model"] == m)
            bars = ax.bar([o for o, _ in pts], [v for _, v in pts],
                          color=[colour[o] for o, _ in pts])
            ax.bar_label(bars, fmt="%.2fx", fontsize=8)
            labelled = False
            for i, (o, _) in enumerate(pts):
                if o in marks:
                    v, upto = marks[o]
                    ax.plot([i - 0.4, i + 0.4], [v, v], color="black", lw=2,
                            label=None if labelled else "paper")
                    labelled = True
                    ax.text(i + 0.42, v, f"{'≤' if upto else ''}{v:g}x", va="center",
                            fontsize=8)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_ylabel(f"{sw.reference} speedup (iteration time)")
            ax.set_title(f"{m}, {sp[0]['nodes']} nodes, {sp[0]['line_rate_gbps']:g} Gb/s")
            if labelled:
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "speedups.png", dpi=110)
        plt.close(fig)
        files.append(out / "speedups.png")
    for axis, other, fname in (("nodes", "line_rate_gbps", "speedup_vs_nodes.png"),
                               ("line_rate_gbps", "nodes", "speedup_vs_rate.png")):
        xs = sorted({s[axis] for s in sp})
        if len(xs) < 2:
            continue
        fixed = max(s[other] for s in sp)  # the largest other dimension
        fig, axes = plt.subplots(1, len(sw.models), figsize=(5 * len(sw.models), 3.8),
                                 squeeze=False)
        for ax, m in zip(axes[0], sw.models, strict=True):
            for over in sorted({s["over"] for s in sp}):
                pts = sorted((s[axis], s["speedup"]) for s in sp
                             if s["model"] == m and s["over"] == over and s[other] == fixed)
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=f"over {over}",
                            color=colour[over])
                    mark(ax, over)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("nodes" if axis == "nodes" else "line rate (Gb/s)")
            ax.set_ylabel(f"{sw.reference} speedup (iteration time)")
            unit = "Gb/s" if other == "line_rate_gbps" else "nodes"
            ax.set_title(f"{m}, {fixed:g} {unit}")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        files.append(out / fname)
    return files
