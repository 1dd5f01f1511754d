"""What each fault kind costs a run, in the sim back end (issue 34): per kind, when it was
found and recovered, the re-plans, and the iterations lost (0 unless a rank died).

    python bench/recovery_bench.py

A 4 x 4 grid, ring over 15 ranks (n3-3 spare), 12 iterations, each fault injected
mid-iteration (`at_ms`), recovery `spare`. Printed, never asserted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.config import Experiment, LoadedExperiment, Monitor

from tests.helpers import make_testbed

FAULTS = [
    {"kind": "dead-wss", "target": "wss-row1"},
    {"kind": "dead-board", "target": "n1-2"},  # a rank: its iteration runs again
    {"kind": "corrupt-link", "target": "n1-1/H"},
    {"kind": "slow-tx", "target": "n1-1/H", "tune_ns": 200},
    {"kind": "wss-route", "target": "wss-row1", "input": 0, "channel": 0, "output": 2},
    {"kind": "control-loss", "target": "bus", "drop_probability": 0.05, "duration_ms": 20},
    {"kind": "broker-restart", "target": "broker", "duration_ms": 20},
]


def main() -> None:
    tb = make_testbed(4, 4)
    tb = tb.model_copy(update={"monitor": Monitor(heartbeat_ms=10.0, grace_ms=2000)})
    print(f"{'fault':<16} {'found ms':>9} {'recovered ms':>13} {'replans':>8} "
          f"{'iterations lost':>16} {'iterations':>11} {'violations':>11} {'wall s':>7}")
    for f in FAULTS:
        exp = Experiment.model_validate({
            "name": "recovery", "testbed": "tb.toml", "iterations": 12, "recovery": "spare",
            "workload": {"model": "resnet50", "collective": "ring", "epochs": 1,
                         "dataset_samples": 1_000_000, "batch_per_node": 64,
                         "compute_time_ms": 5.0, "ranks": 15},
            "networks": [{"name": "oddl", "kind": "oddl"}],
            "faults": [{**f, "at_ms": 40.0}]})
        t = time.perf_counter()
        res = run_experiment(LoadedExperiment(Path("r.toml"), exp, Path("tb.toml"), tb),
                             checker_mode="record")
        wall = time.perf_counter() - t
        r = res.networks["oddl"]
        for row in r.faults:
            found, back = row["detected_after_ns"], row["recovered_after_ns"]
            print(f"{row['kind']:<16} {'-' if found is None else f'{found / 1e6:.1f}':>9} "
                  f"{'-' if back is None else f'{back / 1e6:.1f}':>13} {row['replans']:>8} "
                  f"{row['iterations_lost']:>16} {r.iterations:>11} "
                  f"{res.invariant_violations:>11} {wall:>7.1f}")


if __name__ == "__main__":
    main()
