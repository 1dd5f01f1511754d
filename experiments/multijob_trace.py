"""Writes experiments/multijob-1024.csv: the job trace of experiments/multijob-1024.toml.

20 jobs, Poisson arrivals (exponential gaps, mean 200 ms), models drawn from ResNet-50,
VGG-19 and BERT-large, ranks from 16 to 256 (powers of two), a few iterations
each (5-15: the trace is scaled down from epochs so that every flow of every job is simulated:
docs/multijob.md). Seeded: running it again writes the same file.

    python experiments/multijob_trace.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

JOBS, SEED, MEAN_GAP_MS = 20, 2024, 200.0
MODELS = ("resnet50", "vgg19", "bert-large")
RANKS = (16, 32, 64, 128, 256)


def main() -> None:
    rng = np.random.default_rng(SEED)
    t = 0.0
    rows = ["# written by experiments/multijob_trace.py (seed 2024); docs/multijob.md",
            "name,arrival_ms,model,ranks,iterations"]
    for k in range(JOBS):
        model = MODELS[rng.integers(len(MODELS))]
        ranks = RANKS[rng.integers(len(RANKS))]
        iterations = int(rng.integers(5, 16))
        rows.append(f"{model}-{k:02d},{t:.1f},{model},{ranks},{iterations}")
        t += rng.exponential(MEAN_GAP_MS)
    Path(__file__).with_name("multijob-1024.csv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
