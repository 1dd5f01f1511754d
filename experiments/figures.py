"""docs/comparison.md's and docs/optinc.md's tables, from runs: one command.

    python experiments/figures.py [--write] [--only NAME ...] [--jobs N] [--runs DIR]

Each table is a section below: it runs its commands (`oddl sweep`, `oddl optinc ...`),
prints the table as markdown and, with `--write`, puts it into its page between the
markers `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`, with the command, the date
and the machine. Sweeps write into `--runs` (default: a new directory under /tmp), so
rerunning into the same one resumes them. `--list` names the sections and what each
costs. The prose around a table is the docs' own: read it again when a figure moves.

The CASSINI tables (docs/cassini.md) have their own commands:
`python experiments/cassini_table.py [--law ...]` and `oddl run experiments/cassini-fattree.toml`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXP = ROOT / "experiments"


def oddl(*args: str) -> dict[str, Any]:
    """One `oddl ... --json` command's object."""
    r = subprocess.run([sys.executable, "-m", "oddl.app", *args, "--json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"oddl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def sweep(name: str, runs: Path, jobs: int, **fields: Any) -> dict[str, Any]:
    """`oddl sweep experiments/NAME.toml` into runs/NAME (resumed if there), with its
    top-level `fields` replaced (then into runs/NAME-KEY-VALUE...): its results.json."""
    path = EXP / f"{name}.toml"
    if fields:
        name += "".join(f"-{k}-{v}" for k, v in sorted(fields.items()))
        path = _variant(path, runs / f"{name}.toml", **fields)
    out = runs / name
    r = subprocess.run([sys.executable, "-m", "oddl.app", "sweep",
                        str(path), "--jobs", str(jobs), "--out", str(out)],
                       stdout=subprocess.DEVNULL)
    if r.returncode != 0:  # its error is on stderr, above
        raise SystemExit(f"oddl sweep {path}: exit {r.returncode}")
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


def _variant(src: Path, dest: Path, workload: dict[str, Any] | None = None,
             **top: Any) -> Path:
    """`src` (an experiment or a sweep) with its workload's fields and its top-level keys
    replaced, written to `dest` (its testbed named absolutely)."""
    import tomllib

    import tomli_w

    data = tomllib.loads(src.read_text())
    data["testbed"] = str((src.parent / data["testbed"]).resolve())
    if workload:
        data["workload"] = {**data["workload"], **workload}
    data.update(top)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(tomli_w.dumps(data))
    return dest


def _x(v: float) -> str:
    return f"{v:.3f}x"


def _points(doc: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(r["network"], r["model"], r["nodes"]): r for r in doc["results"]}


def _speedups(doc: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(s["over"], s["model"], s["nodes"]): s for s in doc["speedups"]}


# ---- docs/comparison.md ------------------------------------------------------------

def jocn(runs: Path, jobs: int) -> str:
    doc = sweep("jocn-1024-vgg19", runs, jobs)
    sp, pts = _speedups(doc), _points(doc)
    papers = {k.split("_over_", 1)[1]: v for k, v in doc["sweep"].get("papers", {}).items()}
    ref = pts[("oddl", "vgg19", 1024)]
    rows = ["| ODDL speedup over | sharing | paper | ours, training (with compute) | "
            "ours, communication only | its iteration |", "|---|---|---|---|---|---|"]
    for net in doc["sweep"]["networks"]:
        name = net["name"]
        if name == "oddl":
            continue
        s = sp[(name, "vgg19", 1024)]
        law = {"fair": "fluid (max-min)", "dcqcn": "DCQCN", "tcp": "TCP Reno"}.get(
            net["sharing"], net["sharing"]) if net["kind"] == "fattree" else {
            "electrical": "one switch, no link shared"}.get(net["kind"], "its own lightpaths")
        paper = f"{papers[name]}x" if name in papers else "—"
        it = pts[(name, "vgg19", 1024)]["iteration_ms"]
        rows.append(f"| {name} | {law} | {paper} | {_x(s['speedup'])} | "
                    f"{_x(s['comm_speedup'])} | {it:.2f} ms |")
    rows.append(f"\nODDL's iteration: {ref['iteration_ms']:.2f} ms, its all-reduce "
                f"{ref['comm_ms']:.2f} ms.")
    return "\n".join(rows)


def topoopt(runs: Path, jobs: int) -> str:
    """Communication alone (the sweep as written), then training on a V100 from the
    layer tables (batch 32), overlap off / on."""
    doc = sweep("topoopt-vs-fattree", runs, jobs)
    sp = _speedups(doc)
    off = _speedups(sweep("topoopt-vs-fattree", runs, jobs, device="v100"))
    on = _speedups(sweep("topoopt-vs-fattree", runs, jobs, device="v100", overlap=True))
    nodes = doc["sweep"]["nodes"]
    rows = ["| TopoOpt speedup over | " + " | ".join(
        f"{n} nodes: communication; training, overlap off / on" for n in nodes) + " |",
            "|---|" + "---|" * len(nodes)]
    for net in doc["sweep"]["networks"]:
        if net["name"] == doc["sweep"]["reference"]:
            continue
        for model in doc["sweep"]["models"]:
            cells = [f"{_x(sp[k]['speedup'])}; {_x(off[k]['speedup'])} / "
                     f"{_x(on[k]['speedup'])}" for k in ((net["name"], model, n)
                                                         for n in nodes)]
            rows.append(f"| {net['name']}, {net['collective'] or doc['sweep']['collective']} "
                        f"({model}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def control(runs: Path, jobs: int) -> str:
    doc = sweep("control-overhead", runs, jobs)
    pts = _points(doc)
    nodes = doc["sweep"]["nodes"]
    p = [pts[("oddl", "resnet50", n)] for n in nodes]
    return "\n".join([
        "| nodes | " + " | ".join(map(str, nodes)) + " |", "|---|" + "---|" * len(nodes),
        "| control messages per node per iteration | "
        + " | ".join(f"{r['control_msgs_per_node']:.0f}" for r in p) + " |",
        "| arbiter planning time (ms) | " + " | ".join(f"{r['plan_ms']:.1f}" for r in p) + " |",
        "| all-reduce time (ms) | " + " | ".join(f"{r['comm_ms']:.2f}" for r in p) + " |"])


def run(path: Path, out: Path, *more: str) -> dict[str, Any]:
    """`oddl run EXPERIMENT --json` into `out`: its JSON object (a finished run there is
    read again, not rerun: rerunning into the same --runs resumes)."""
    done = out / "summary.json"
    if done.is_file():
        prev: dict[str, Any] = json.loads(done.read_text())
        return prev
    r = subprocess.run([sys.executable, "-m", "oddl.app", "run", str(path), "--json",
                        "--no-plot", "--force", "--out", str(out), *more],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"oddl run {path}: exit {r.returncode}: {r.stderr.strip()}")
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def table1(runs: Path, jobs: int) -> str:
    """Table 1 with DDP's buckets overlapping backward beside the model without."""
    rows = ["| | paper | overlap off | overlap on |", "|---|---|---|---|"]
    got = {}
    for on in (False, True):
        exp = _variant(EXP / "table1-resnet50.toml", runs / f"table1-{on}.toml",
                       {"overlap": on})
        got[on] = run(exp, runs / f"table1-{on}")
    for net, paper in (("electrical", "97.3 min"), ("oddl", "97.8 min")):
        rows.append(f"| {net} | {paper} | " + " | ".join(
            f"{got[on]['networks'][net]['training_time_s'] / 60:.3f} min" for on in
            (False, True)) + " |")
    rows.append("| ratio | 1.005 | " + " | ".join(f"{got[on]['ratio']:.6f}" for on in
                                                   (False, True)) + " |")
    return "\n".join(rows)


JOCN_BATCHES = (16, 32, 64, 128, 256)
JOCN_NETS = ("oddl", "electrical", "fattree-3to1", "fattree-3to1-dcqcn", "sipring")


def jocn_batch(runs: Path, jobs: int) -> str:
    """The JOCN comparison (1,024 nodes, VGG-19, 100 Gb/s) over the batch, compute from
    VGG-19's layer table on a V100, overlap off and on: ODDL's speed-up over each."""
    import tomllib

    import tomli_w
    from oddl.controller.base.accelerators import ACCELERATORS
    from oddl.controller.base.layers import layer_table

    t = layer_table("vgg19")
    src = tomllib.loads((EXP / "jocn-1024-vgg19.toml").read_text())
    nets = [n for n in src["networks"] if n["name"] in JOCN_NETS]
    base = {"name": "jocn-batch", "testbed": str((EXP / src["testbed"]).resolve()),
            "iterations": 1, "networks": nets}
    got: dict[tuple[int, bool], dict[str, Any]] = {}
    for b in JOCN_BATCHES:
        for on in (False, True):
            exp = runs / f"jocn-b{b}-{on}.toml"
            exp.write_text(tomli_w.dumps({**base, "workload": {
                "model": "vgg19", "collective": src["collective"], "epochs": 1,
                "dataset_samples": 1_281_167, "batch_per_node": b, "device": "v100",
                "overlap": on}}))
            got[(b, on)] = run(exp, runs / f"jocn-b{b}-{on}")["networks"]
    others = [n for n in JOCN_NETS if n != "oddl"]
    rows = ["| batch | compute | ODDL's iteration, off / on | "
            + " | ".join(f"over {n}, off / on" for n in others) + " |",
            "|---|---|---|" + "---|" * len(others)]
    for b in JOCN_BATCHES:
        off, on = got[(b, False)], got[(b, True)]
        it = {k: (off[k]["iteration_time_s"], on[k]["iteration_time_s"]) for k in JOCN_NETS}
        compute = b * (t.fwd_flops + t.bwd_flops) / ACCELERATORS["v100"].flops_per_s
        rows.append(f"| {b} | {compute * 1e3:.0f} ms | {it['oddl'][0] * 1e3:.1f} / "
                    f"{it['oddl'][1] * 1e3:.1f} ms | " + " | ".join(
                        f"{it[n][0] / it['oddl'][0]:.3f}x / {it[n][1] / it['oddl'][1]:.3f}x"
                        for n in others) + " |")
    return "\n".join(rows)


# ---- docs/cassini.md ---------------------------------------------------------------

def talk(runs: Path, jobs: int) -> str:
    """The talk's table (experiments/cassini_table.py, the fluid link) with each job's
    compute and all-reduce in sequence, and with DDP's buckets overlapping backward."""
    got = {}
    for on in (False, True):
        r = subprocess.run([sys.executable, str(EXP / "cassini_table.py"), "--json",
                            *(["--overlap"] if on else [])], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"cassini_table.py: exit {r.returncode}: {r.stderr.strip()}")
        got[on] = json.loads(r.stdout)

    def f(xs: list[float]) -> str:
        return " / ".join(f"{x:.2f}x" for x in xs)

    rows = ["| jobs | talk: unfair, verdict | ours, overlap off: unfair, CASSINI, verdict | "
            "ours, overlap on: unfair, CASSINI, verdict |", "|---|---|---|---|"]
    agree = {False: 0, True: 0}
    for off, on in zip(got[False], got[True], strict=True):
        cells = []
        for on_, r in ((False, off), (True, on)):
            agree[on_] += r["compatible"] == r["talk_compatible"]
            cells.append(f"{f(r['unfair'])}, {f(r['cassini'])}, "
                         f"{'compatible' if r['compatible'] else 'not'}")
        rows.append(f"| {' + '.join(off['jobs'])} | {f(off['talk_unfair'])}, "
                    f"{'compatible' if off['talk_compatible'] else 'not'} | "
                    + " | ".join(cells) + " |")
    rows.append(f"\nVerdicts as the talk's: {agree[False]} of {len(got[False])} with overlap "
                f"off, {agree[True]} of {len(got[True])} with it on.")
    return "\n".join(rows)


def cassini_headline(runs: Path, jobs: int) -> str:
    """experiments/cassini-fattree.toml's fluid networks (fair, CASSINI, MLTCP), every job
    as written and with DDP's buckets overlapping its backward: mean and p99 JCT."""
    import tomllib

    import tomli_w

    src = EXP / "cassini-fattree.toml"
    data = tomllib.loads(src.read_text())
    data["testbed"] = str((src.parent / data["testbed"]).resolve())
    data["networks"] = [n for n in data["networks"] if n.get("sharing", "fair") in
                        ("fair", "mltcp")]
    rows = ["| policy | overlap off: mean JCT, p99 JCT, vs fair | overlap on: mean JCT, "
            "p99 JCT, vs fair |", "|---|---|---|"]
    cells: dict[str, list[str]] = {n["name"]: [] for n in data["networks"]}
    for on in (False, True):
        exp = runs / f"cassini-{on}.toml"
        exp.write_text(tomli_w.dumps({**data, "jobs": [{**j, "overlap": on}
                                                       for j in data["jobs"]]}))
        got = run(exp, runs / f"cassini-{on}")["networks"]  # (the run's own figures)
        mean = {n: got[n]["fabric"]["mean_jct_s"] for n in cells}
        p99 = {n: got[n]["fabric"]["p99_jct_s"] for n in cells}
        for n in cells:
            cells[n].append(f"{mean[n]:.3f} s, {p99[n]:.3f} s, {mean['fair'] / mean[n]:.2f}x"
                            f" / {p99['fair'] / p99[n]:.2f}x")
    rows += [f"| {n} | " + " | ".join(c) + " |" for n, c in cells.items()]
    rows.append("| CASSINI, published | | up to 1.6x / 2.5x |")
    return "\n".join(rows)


# ---- docs/lightning.md -------------------------------------------------------------

LIGHTNING_TRACES: Path | None = None  # --lightning-traces: the release's sim_scheds/


def lightning_serve(runs: Path, jobs: int) -> str:
    """`oddl lightning serve` on the release's ten traces (lightning-lts
    simulation/sim_scheds/, read as plain data) and on ten of our own drawing, each
    aggregated both ways: the largest ratio over the models (the release's "Max" row) and
    the mean over them (the abstract's "average inference serve time")."""
    if LIGHTNING_TRACES is None:
        raise SystemExit("lightning-serve: give --lightning-traces DIR (lightning-lts's "
                         "simulation/sim_scheds/)")
    got = {"the release's ten traces": oddl("lightning", "serve", "--traces",
                                             str(LIGHTNING_TRACES)),
           "ten of ours (seeds 1-10)": oddl("lightning", "serve")}
    procs = list(next(iter(got.values()))["serve_time_ratio"])
    rows = ["| traces | aggregation | " + " | ".join(f"{p} / Lightning" for p in procs)
            + " |", "|---|---|" + "---|" * len(procs)]
    for name, r in got.items():
        rows.append(f"| {name} | largest over the models | " + " | ".join(
            f"{r['serve_time_ratio'][p]:.0f}x" for p in procs) + " |")
        rows.append("| | mean over the models | " + " | ".join(
            f"{r['serve_time_ratio_mean'][p]:.0f}x" for p in procs) + " |")
    pub = next(iter(got.values()))["published"]["serve_time_ratio"]
    rows.append("| published | | " + " | ".join(f"{pub[p]:.0f}x" for p in procs) + " |")
    by = got["the release's ten traces"]["serve_time_ratio_by_model"]
    rows.append("\nOn the release's traces, by model (mean over the ten): " + "; ".join(
        f"{p}: " + ", ".join(f"{m} {x:.0f}x" for m, x in by[p].items()) for p in procs) + ".")
    return "\n".join(rows)


# ---- docs/optinc.md ----------------------------------------------------------------

def optinc_ring(runs: Path, jobs: int) -> str:
    doc = sweep("optinc-vs-ring", runs, jobs)
    pts = _points(doc)
    rows = ["| servers | OptINC | ring (ideal switch) | speed-up | HD (ideal switch) | "
            "ODDL (HD) |", "|---|---|---|---|---|---|"]
    for n in doc["sweep"]["nodes"]:
        ms = {k: pts[(k, "resnet50", n)]["comm_ms"]
              for k in ("optinc", "ring-electrical", "hd-electrical", "oddl")}
        o = ms["optinc"]
        rows.append(f"| {n} | {o:.2f} ms | {ms['ring-electrical']:.1f} ms | "
                    f"{ms['ring-electrical'] / o:.1f}x | {ms['hd-electrical'] / o:.1f}x | "
                    f"{ms['oddl'] / o:.1f}x |")
    return "\n".join(rows)


def optinc_train(runs: Path, jobs: int) -> str:
    rows = ["| servers | exact | OptINC (default chip) | replicas apart |", "|---|---|---|---|"]
    for n, label in ((4, "4"), (8, "8"), (16, "16 (4 × 4 cascade)")):
        d = oddl("optinc", "train", "--servers", str(n))
        rows.append(f"| {label} | {d['exact_accuracy']:.4f} | {d['optical_accuracy']:.4f} | "
                    f"{d['replica_drift']:.4f} |")
    return "\n".join(rows)


def optinc_onn(runs: Path, jobs: int) -> str:
    rows = ["| unit | MZIs | ideal chip | noisy chip, trained ideally | noisy chip, "
            "hardware-aware | the same with pilots (passes a pass) |",
            "|---|---|---|---|---|---|"]

    def row(label: str, d: dict[str, Any]) -> str:
        return (f"| {label} | {d['mzis']:,} | {d['exact_share_ideal_chip']:.2%} | "
                f"{d['exact_share_ideally_trained']:.2%} | {d['exact_share']:.2%} | "
                f"{d['exact_share_checked']:.2%} ({d['passes_checked']:.2f}) |")

    cascades = []
    for n in (4, 8):
        d = oddl("optinc", "onn", "--servers", str(n))
        rows.append(row(f"{n} servers, one unit", d["onn"]))
        if "cascade" in d:
            cascades.append(row(f"{n * n} servers, {n} x {n} cascade "
                                f"({d['cascade']['chips']} chips)", d["cascade"]))
    return "\n".join(rows + cascades)


def optinc_cnn(runs: Path, jobs: int) -> str:
    rows = ["| servers | exact | ring at 8 bits | trained ONN, noisy chip, pilots | "
            "passes a step |", "|---|---|---|---|---|"]
    for label, args in (("4", ["--servers", "4"]), ("8", ["--servers", "8"]),
                        ("16 (4 × 4 cascade)", ["--servers", "16", "--ports", "4"])):
        d = oddl("optinc", "train", "--onn", "trained", *args)
        rows.append(f"| {label} | {d['exact_accuracy']:.4f} | {d['ring_accuracy']:.4f} | "
                    f"{d['optical_accuracy']:.4f} | "
                    f"{d['iteration_communication']['passes']:.2f} |")
    return "\n".join(rows)


@dataclass(frozen=True)
class Section:
    page: Path
    make: Callable[[Path, int], str]
    cost: str


SECTIONS = {
    "table1": Section(DOCS / "model.md", table1, "10 s"),
    "jocn-batch": Section(DOCS / "comparison.md", jocn_batch, "about 25 minutes"),
    "jocn": Section(DOCS / "comparison.md", jocn, "about 12 minutes at --jobs 2"),
    "talk": Section(DOCS / "cassini.md", talk, "25 s"),
    "cassini-headline": Section(DOCS / "cassini.md", cassini_headline, "2 minutes"),
    "lightning-serve": Section(DOCS / "lightning.md", lightning_serve, "about 25 minutes"),
    "topoopt": Section(DOCS / "comparison.md", topoopt, "2 minutes"),
    "control": Section(DOCS / "comparison.md", control, "35 s"),
    "optinc-ring": Section(DOCS / "optinc.md", optinc_ring, "2 minutes"),
    "optinc-train": Section(DOCS / "optinc.md", optinc_train, "1 minute"),
    "optinc-onn": Section(DOCS / "optinc.md", optinc_onn, "3 minutes"),
    "optinc-cnn": Section(DOCS / "optinc.md", optinc_cnn, "about 8 minutes"),
}


def machine() -> str:
    """The CPU and numpy's SIMD: what the optical columns depend on (docs/optinc.md)."""
    import numpy as np
    from numpy.core._multiarray_umath import __cpu_features__ as f  # type: ignore[import]

    simd = "AVX-512" if f.get("AVX512F") else "AVX2" if f.get("AVX2") else "SSE"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, numpy {np.__version__} with {simd}"


def put(page: Path, name: str, table: str) -> None:
    """The table into `page` between its markers; the page must have them."""
    begin, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
    text = page.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{page}: no markers {begin} ... {end}")
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    page.write_text(f"{head}{begin}\n{table}\n{end}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="into the docs, between markers")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--jobs", type=int, default=2, help="sweeps' worker processes")
    ap.add_argument("--runs", type=Path, default=None,
                    help="where sweeps write (rerun into it to resume)")
    ap.add_argument("--list", action="store_true", help="the sections and their cost")
    ap.add_argument("--lightning-traces", type=Path, default=None,
                    help="lightning-serve: the release's simulation/sim_scheds/ folder")
    a = ap.parse_args()
    global LIGHTNING_TRACES
    LIGHTNING_TRACES = a.lightning_traces
    if a.list:
        for k, s in SECTIONS.items():
            print(f"{k:13} {s.page.relative_to(ROOT)}  ({s.cost})")
        return
    runs = a.runs or Path(tempfile.mkdtemp(prefix="oddl-figures-"))
    runs.mkdir(parents=True, exist_ok=True)
    stamp = (f"(`python experiments/figures.py --only NAME --write`, "
             f"{datetime.date.today().isoformat()}, on {machine()}.)")
    for name in a.only:
        s = SECTIONS[name]
        t = f"{s.make(runs, a.jobs)}\n\n{stamp.replace('NAME', name)}"
        print(f"## {name} ({s.page.relative_to(ROOT)})\n\n{t}\n", flush=True)
        if a.write:
            put(s.page, name, t)


if __name__ == "__main__":
    main()
