"""The multi-job trace (experiments/multijob-1024.toml) on every network: wall time per
network and the figures it prints (issue 15's target: all networks in <= 5 min on 2
cores). Figures printed, nothing asserted.

    python bench/multijob_bench.py [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oddl.app.experiments.runner import run_experiment  # noqa: E402
from oddl.controller.base.config import load_experiment  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default=str(ROOT / "experiments/multijob-1024.toml"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ctx = load_experiment(a.experiment)
    out: dict[str, dict[str, float]] = {}
    t_all = time.perf_counter()
    for spec in ctx.experiment.networks:  # one at a time, to time each
        one = dataclasses.replace(ctx, experiment=ctx.experiment.model_copy(
            update={"networks": [spec]}))
        t = time.perf_counter()
        res = run_experiment(one)
        r = res.networks[spec.name]
        out[spec.name] = {"wall_s": round(time.perf_counter() - t, 1), **r.fabric,
                          "iterations": r.iterations, "flows": r.flows,
                          "violations": r.invariant_violations, **r.stats}
        print(f"{spec.name:<14}", out[spec.name], flush=True)
    print(f"all {len(out)} networks: {time.perf_counter() - t_all:.1f} s wall "
          f"({len(ctx.jobs)} jobs on {ctx.testbed.n_nodes} nodes)", flush=True)
    if a.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
