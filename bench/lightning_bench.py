"""Lightning on the emulated QICK board (issue 47): figures printed, nothing asserted.

    python bench/lightning_bench.py [--samples 50] [--values 20000]

- multiply-accumulate: values a second through the board (qick programs built, envelopes
  loaded, played, read and decoded), in process;
- inference (MNIST, paced by the board's datapath): wall time a digit, host calls and
  products, the count-action firings, with the network trained once beforehand (its
  training time printed apart);
- the decoded sums' error against the exact ones, in product LSBs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from oddl.app.registry import open_core, open_inference, open_soc
from oddl.studies import lenet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--values", type=int, default=20_000)
    args = ap.parse_args()

    soc, soccfg = open_soc("emulated", dacs=4)
    core = open_core(soc, soccfg)
    t = time.perf_counter()
    cal = core.calibrate()
    print(f"calibration: {time.perf_counter() - t:.2f} s, {cal.as_dict()}")

    v = np.random.default_rng(1).integers(0, 256, (args.values, 4))
    runs0, t = core.runs, time.perf_counter()
    got = core.mac(v)
    wall = time.perf_counter() - t
    err = (got - (v[:, 0::2] * v[:, 1::2]).sum(axis=1)) / 256
    print(f"multiply-accumulate: {args.values:,} values ({2 * args.values:,} products) in "
          f"{core.runs - runs0} runs, {wall:.2f} s: {args.values / wall:,.0f} values/s; "
          f"error rms {np.sqrt(np.mean(err ** 2)):.3f} LSB, worst {np.abs(err).max():.3f} LSB")

    xtr, ytr, xte, _ = lenet.digits()
    t = time.perf_counter()
    net = lenet.train(xtr, ytr)
    shape = "-".join(map(str, net.layers))
    print(f"training {shape} on {len(xtr)} MNIST digits: {time.perf_counter() - t:.2f} s")
    inf = open_inference(net, core)
    calls0, products0, t = core.calls, core.products, time.perf_counter()
    for x in xte[:args.samples]:
        inf.photonic(x)
    wall = time.perf_counter() - t
    print(f"inference: {args.samples} digits in {wall:.2f} s ({wall / args.samples * 1e3:.0f} "
          f"ms a digit); {(core.calls - calls0) / args.samples:g} host calls a digit, "
          f"{core.products - products0:,} products, "
          f"{inf.firings:,} count-action firings ({inf.firings / args.samples:,.0f} a digit)")


if __name__ == "__main__":
    main()
