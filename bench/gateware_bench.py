"""The gateware in the loop, in figures (printed, not asserted): `python bench/gateware_bench.py`.

Runs Table 1's ODDL network for a few iterations with every O-NIC as the simulated RTL
(`--board-model rtl`) and as the Python model, and prints the wall time of each, the clock
cycles the RTL simulated, and cycles per second. The iteration times must agree to the
nanosecond (tests/test_gateware.py holds the model and the RTL to each other).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oddl.app.experiments.runner import run_experiment  # noqa: E402
from oddl.controller.base.config import load_experiment  # noqa: E402
from oddl.sim.devices.rtl_board import CLOCK_HZ, cycles_simulated  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    base = load_experiment(ROOT / "experiments" / "table1-resnet50.toml")
    times = {}
    for model in ("python", "rtl"):
        ctx = dataclasses.replace(base, testbed=base.testbed.with_board_model(model))
        c0, t0 = cycles_simulated(), time.perf_counter()
        res = run_experiment(ctx, iterations=args.iterations)
        wall = time.perf_counter() - t0
        net = res.networks["oddl"]
        times[model] = net.iteration_time_s
        line = f"{model:>6}: {wall:6.2f} s wall, {net.flows} ODDL flows, iteration " \
               f"{net.iteration_time_s * 1e3:.6f} ms"
        if model == "rtl":
            cyc = cycles_simulated() - c0
            line += (f", {cyc:,} RTL cycles ({cyc / CLOCK_HZ * 1e6:.1f} us of a 250 MHz "
                     f"clock), {cyc / wall:,.0f} cycles/s")
        print(line)
    print("iteration times agree to the ns:", abs(times["python"] - times["rtl"]) < 1e-9)


if __name__ == "__main__":
    main()
