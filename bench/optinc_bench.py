"""OptINC's issue-19 targets, printed (never asserted).

    python bench/optinc_bench.py [--quick]

1. `oddl optinc train` with 8 servers (30 epochs, the default chip): wall time, both
   accuracies (target: <= 60 s);
2. calibration of one averaging unit per size: wall time and matrix error;
3. the trained ONN (4 servers, 8 bits): values a second through one simulated pass, and
   the hardware-aware training of one cell;
4. without --quick, the optinc-vs-ring sweep, 4 to 1024 servers, two workers (target:
   <= 2 min).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from oddl.studies import quantiser as Q
from oddl.studies.onn import CHIP, AveragingUnit
from oddl.studies.training import compare

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    quick = "--quick" in sys.argv
    t = time.perf_counter()
    ex, op, _ = compare(8, CHIP, epochs=30)
    print(f"train, 8 servers, 30 epochs: {time.perf_counter() - t:.1f} s wall; accuracy "
          f"exact {ex.final:.4f}, optical {op.final:.4f}")
    for n in (4, 8) if quick else (4, 8, 12, 16):
        t = time.perf_counter()
        u = AveragingUnit(n, CHIP, seed=0)
        print(f"calibrate a {n}-port unit: {time.perf_counter() - t:.1f} s; matrix error "
              f"{u.error_before:.2e} -> {u.error_after:.2e}")
    unit = Q.load(Q.trained_path(4)).hardware_aware(CHIP)
    v = np.random.default_rng(0).integers(0, 256, (4, 100_000))
    t = time.perf_counter()
    unit.run(v)
    print(f"trained ONN: one pass of 100,000 values simulated in {time.perf_counter() - t:.2f} "
          f"s ({100_000 / (time.perf_counter() - t):,.0f} values/s)")
    t = time.perf_counter()
    Q.tune(unit.cells[0], 4, CHIP)
    print(f"hardware-aware training of one cell (12 draws, 30 steps): "
          f"{time.perf_counter() - t:.1f} s")
    if not quick:
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "oddl.app", "sweep",
                            str(ROOT / "experiments" / "optinc-vs-ring.toml"), "--jobs", "2"],
                           cwd=d, check=True, capture_output=True)
            print(f"optinc-vs-ring sweep (30 points): {time.perf_counter() - t:.1f} s wall")


if __name__ == "__main__":
    main()
