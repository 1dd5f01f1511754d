"""The gateware in the loop, in figures (printed, not asserted): `python bench/gateware_bench.py`.

Runs Table 1's ODDL network for a few iterations with the Python models, with every O-NIC's
register IP as the simulated RTL (`--board-model rtl`), and with every O-NIC's stage-2
control unit as the simulated RTL (`--control-model rtl`), and prints the wall time of
each, the clock cycles the RTL simulated, cycles per second of the run and of the
simulator alone, and the control unit's decision latencies. The iteration times must agree
to the nanosecond (tests/test_gateware.py and tests/test_control_unit_rtl.py hold the models
and the RTL to each other).
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
from oddl.sim.devices import rtl_board, rtl_control_unit  # noqa: E402

CLOCK_HZ = rtl_board.CLOCK_HZ


def _timed(core: type) -> list[float]:
    """Wall time spent in the simulator (each core's `run`), from now on."""
    spent = [0.0]
    run = core.run

    def timed(self: object, op: object) -> object:
        t0 = time.perf_counter()
        try:
            return run(self, op)
        finally:
            spent[0] += time.perf_counter() - t0
    core.run = timed  # type: ignore[attr-defined]
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    base = load_experiment(ROOT / "experiments" / "table1-resnet50.toml")
    times = {}
    sims = {"board": (rtl_board, _timed(rtl_board._Core)),
            "control": (rtl_control_unit, _timed(rtl_control_unit._Core))}
    sims["board-verilator"] = (rtl_board, _timed(rtl_board._VCore))
    sims["verilator"] = (rtl_control_unit, _timed(rtl_control_unit._VCore))
    for what in ("python", "board", "board-verilator", "control", "verilator"):
        tb = base.testbed
        if what == "board":
            tb = tb.with_board_model("rtl")
        elif what == "board-verilator":
            tb = tb.with_board_model("rtl").with_control_model(None, "verilator")
        elif what == "control":
            tb = tb.with_control_model("rtl")
        elif what == "verilator":
            tb = tb.with_control_model("rtl", "verilator")
        if what.endswith("verilator"):  # built before the clock starts (once a machine)
            from oddl.fpga.gateware import verilated
            from oddl.fpga.gateware.onic_ctrl import OnicCtrl

            t0 = time.perf_counter()
            verilated.build(OnicCtrl() if what == "board-verilator" else
                            rtl_control_unit._design(rtl_control_unit.Bounds()),
                            "onic_ctrl" if what == "board-verilator" else "ctrl_unit")
            print(f"{'':>22}Verilator's library: {time.perf_counter() - t0:.1f} s (cached "
                  f"after the first build)")
        ctx = dataclasses.replace(base, testbed=tb)
        c0 = {k: m.cycles_simulated() for k, (m, _) in sims.items()}
        s0 = {k: spent[0] for k, (_, spent) in sims.items()}
        t0 = time.perf_counter()
        res = run_experiment(ctx, iterations=args.iterations)
        wall = time.perf_counter() - t0
        net = res.networks["oddl"]
        times[what] = net.iteration_time_s
        label = {"python": "python", "board": "--board-model rtl",
                 "board-verilator": "... --rtl-sim verilator", "control": "--control-model rtl",
                 "verilator": "... --rtl-sim verilator"}[what]
        line = f"{label:>20}: {wall:6.2f} s wall, {net.flows} ODDL flows, iteration " \
               f"{net.iteration_time_s * 1e3:.6f} ms"
        if what in sims:
            mod, spent = sims[what]
            cyc = mod.cycles_simulated() - c0[what]
            in_sim = spent[0] - s0[what]
            line += (f", {cyc:,} RTL cycles ({cyc / CLOCK_HZ * 1e6:.1f} us of a 250 MHz "
                     f"clock), {cyc / wall:,.0f} cycles/s of the run, {cyc / in_sim:,.0f} "
                     f"cycles/s in the simulator ({in_sim:.2f} s)")
        print(line)
        if net.control_unit:
            print(" " * 22 + "decision latency in cycles:", {
                k: v for k, v in net.control_unit.items() if k.endswith("_cycles")})
    print("iteration times agree to the ns:",
          all(abs(times["python"] - t) < 1e-9 for t in times.values()))


if __name__ == "__main__":
    main()
