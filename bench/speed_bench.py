"""Every speed figure of issues 46 and 66, each in a fresh process (its wall time and its own peak
RSS, from wait4), printed beside its target, with the compiled hot path and without it
(ODDL_INTERPRETED=1, the same source run by the interpreter). Figures printed, nothing
asserted.

    python bench/speed_bench.py              # all, both ways (about 25 min on 2 cores)
    python bench/speed_bench.py --quick      # without the long runs (about 2 min)
    python bench/speed_bench.py --compiled   # the compiled path only
    python bench/speed_bench.py --beyond     # also the 16,384-node grid (128 x 128)

docs/performance.md has the figures before and after, and where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
ODDL = [sys.executable, "-c", "from oddl.app.cli import main; main()"]

HEAP = ("import heapq, random; r = random.Random(1); h = []\n"
        "for _ in range(1_000_000): heapq.heappush(h, r.random())\n"
        "for _ in range(1_000_000): heapq.heappop(h)")

# in-process measurements, each run as `python -c` in a fresh interpreter: JSON on stdout
EVENTS = """
import json, time
from oddl.controller.base.config import load_experiment
from oddl.app.api import network
ctx = load_experiment("experiments/table1-resnet50.toml")
with network(ctx, "oddl", {its}, 220_000_000) as net:
    t = time.perf_counter(); net.admission.run(); wall = time.perf_counter() - t
    ev = net.backend.loop.events
print(json.dumps({{"events": ev, "flows": net.admission.outcomes[0].flows, "wall_s": wall}}))
"""
PLAN = """
import json, time
from oddl.controller.base.collectives import build
from oddl.controller.base.config import load_testbed
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.planner import plan_job
from oddl.controller.stage2.workloads import model_spec
tb = load_testbed("{testbed}")
grid = Grid.from_testbed(tb)
t = time.perf_counter()
sched = build("hd", tb.n_nodes, model_spec("resnet50").grad_bytes(), tb.grid.rows, tb.grid.cols)
t_sched = time.perf_counter() - t
t = time.perf_counter()
p = plan_job(tb, grid, sched, strategy="matched")
t_plan = time.perf_counter() - t
print(json.dumps({{"schedule_s": t_sched, "plan_s": t_plan}}))
"""
ITERATION = """
import json, time
from oddl.controller.base.config import load_experiment
from oddl.app.api import network
ctx = load_experiment("{experiment}")
t = time.perf_counter()
with network(ctx, "oddl", 1, 0) as net:
    setup = time.perf_counter() - t
    [rec] = net.admission.run().values()
print(json.dumps({{"setup_s": setup, "plan_s": net.stage1.plan_s,
                  "total_s": time.perf_counter() - t, "flows": net.admission.outcomes[0].flows,
                  "allreduce_ms": rec.iteration_ns[0] / 1e6,
                  "violations": len(net.backend.monitor.violations)}}))
"""
BEYOND_TB = """
[testbed]
name = "grid-16384"
description = "128 x 128 ODDL grid (bench/speed_bench.py --beyond)"
backend = "sim"
[grid]
rows = 128
cols = 128
[optical]
line_rate_gbps = 100
tuning_time_ns = 10.5
guard_time_ns = 2.0
propagation_ns = 100.0
wavelength_grid = { start_nm = 1530.33, spacing_ghz = 50, count = 128 }
[control]
kind = "100GbE"
latency_ns = 1000
request_timeout_ns = 50000
max_retries = 20
grant_lease_ns = 100000
[generate]
nodes = "n{row}-{col}"
wss = true
"""
BEYOND_EXP = """
name = "grid16384-resnet50-hd"
testbed = "grid-16384.toml"
seed = 1
iterations = 1
flow_records = "none"
[workload]
model = "resnet50"
collective = "hd"
epochs = 1
dataset_samples = 1281167
batch_per_node = 32
compute_time_ms = 100
[[networks]]
name = "oddl"
kind = "oddl"
strategy = "matched"
"""


def measure(cmd: list[str], interpreted: bool = False) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) of that process alone, and its stdout."""
    env = {**os.environ, "ODDL_INTERPRETED": "1" if interpreted else ""}
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _pid, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{text[-2000:]}")
    return wall, usage.ru_maxrss / 1024, text


def python(snippet: str, interpreted: bool) -> tuple[float, float, dict[str, float]]:
    wall, rss, text = measure([sys.executable, "-c", snippet], interpreted)
    return wall, rss, json.loads(text.strip().splitlines()[-1])


def one_network(d: str, name: str) -> str:
    """cassini-fattree with only the network `name` (its 16 jobs, the law's 10 us step)."""
    src = ROOT / "experiments" / "cassini-fattree.toml"
    exp = tomllib.loads(src.read_text())
    exp["networks"] = [n for n in exp["networks"] if n["name"] == name]
    exp["testbed"] = str((src.parent / exp["testbed"]).resolve())
    out = Path(d) / f"cassini-{name}.toml"
    out.write_text(tomli_w.dumps(exp))
    return str(out)


Figure = Callable[[bool], str]  # interpreted? -> the figure


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the runs of a minute or more")
    ap.add_argument("--compiled", action="store_true", help="only the compiled hot path")
    ap.add_argument("--beyond", action="store_true", help="also the 16,384-node grid")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        def command(*args: str, rss: bool = False) -> Figure:
            def fig(interpreted: bool) -> str:
                mode = "-interpreted" if interpreted else "-compiled"  # a run directory each
                argv = [a + mode if a.startswith(f"{d}/out-") else a for a in args]
                wall, peak, _ = measure([*ODDL, *argv], interpreted)
                return f"{wall:.1f} s" + (f", {peak:.0f} MB" if rss else "")
            return fig

        def events(interpreted: bool) -> str:
            _w, _r, ev = python(EVENTS.format(its=5000), interpreted)
            return (f"{ev['events'] / ev['wall_s'] / 1e3:,.0f}k ("
                    f"{ev['wall_s'] / ev['flows'] * 1e6:.1f} us/flow)")

        def iteration(interpreted: bool) -> str:
            wall, rss, it = python(ITERATION.format(
                experiment="experiments/grid4096-resnet50-hd.toml"), interpreted)
            return f"{wall:.1f} s ({it['setup_s']:.1f} setup), {rss:.0f} MB"

        def plan(interpreted: bool) -> str:
            _w, _r, pl = python(PLAN.format(testbed="hw_configs/grid-4096.toml"), interpreted)
            return f"{pl['plan_s']:.2f} s (+ {pl['schedule_s']:.2f} s schedule)"

        def laws_tests(interpreted: bool) -> str:
            # the validation tests (DCQCN fairness, the Mathis law, the incast, the runner),
            # not the ones that hold the compiled tick to numpy's (they run both)
            wall, _r, _ = measure([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                                   "no:cacheprovider", "tests/test_congestion.py", "-k",
                                   "not bit and not sums"], interpreted)
            return f"{wall:.1f} s"

        def heap(interpreted: bool) -> str:  # the machine's speed, beside the figures
            wall, _r, _ = measure([sys.executable, "-c", HEAP], interpreted)
            return f"{wall:.2f} s"

        table: list[tuple[str, str, Figure, bool]] = [  # what, target, figure, long?
            ("reference: 1M heapq pushes and pops of random floats", "-", heap, False),
            ("Table 1, `oddl run` (README's main command)", "<= 2 s",
             command("run", "experiments/table1-resnet50.toml", "--out", f"{d}/out-t1",
                     rss=True), False),
            ("Table 1, `oddl run --no-plot`", "-",
             command("run", "experiments/table1-resnet50.toml", "--no-plot", "--out",
                     f"{d}/out-t1np"), False),
            ("Table 1, `oddl run --every-iteration`", "<= 15 s",
             command("run", "experiments/table1-resnet50.toml", "--every-iteration",
                     "--out", f"{d}/out-t1e", rss=True), True),
            ("simulated events/s (Table 1 ODDL, 5,000 iterations)", ">= 300k", events, False),
            ("grid-4096, one HD iteration with setup", "<= 8 s, <= 450 MB", iteration, False),
            ("stage-1 plan of grid-4096, in process", "-", plan, False),
            ("`oddl plan hw_configs/grid-4096.toml --json`", "<= 0.6 s",
             command("plan", "hw_configs/grid-4096.toml", "--json"), False),
            ("`oddl run experiments/multijob-1024.toml`", "<= 20 s",
             command("run", "experiments/multijob-1024.toml", "--out", f"{d}/out-mj", rss=True),
             True),
            ("`oddl sweep experiments/jocn-1024-vgg19.toml --jobs 2`", "<= 30 s",
             command("sweep", "experiments/jocn-1024-vgg19.toml", "--jobs", "2", "--out",
                     f"{d}/out-jocn"), True),
            ("cassini-fattree, the `tcp` network alone (10 us steps)", "<= 30 s",
             command("run", one_network(d, "tcp"), "--out", f"{d}/out-tcp"), True),
            ("cassini-fattree, the `dcqcn` network alone (10 us steps)", "<= 20 s",
             command("run", one_network(d, "dcqcn"), "--out", f"{d}/out-dcqcn"), True),
            ("the congestion validation tests, pytest's wall", "halved", laws_tests, False),
        ]
        if a.beyond:
            (Path(d) / "grid-16384.toml").write_text(BEYOND_TB)
            (Path(d) / "e.toml").write_text(BEYOND_EXP)

            def beyond(interpreted: bool) -> str:
                wall, rss, it = python(ITERATION.format(experiment=f"{d}/e.toml"), interpreted)
                return f"{wall:.1f} s ({it['plan_s']:.2f} plan), {rss:.0f} MB"
            table.append(("grid-16384 (128 x 128): plan and one HD iteration",
                          "within 24 GB", beyond, True))
        print(f"{'what':<58} {'compiled':<34} {'interpreted':<34} target", flush=True)
        for what, target, fig, long in table:
            if long and a.quick:
                continue
            c = fig(False)
            i = "-" if a.compiled else fig(True)
            print(f"{what:<58} {c:<34} {i:<34} {target}", flush=True)
            rows.append({"what": what, "compiled": c, "interpreted": i, "target": target})
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
