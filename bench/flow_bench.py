"""Flow-level baselines: wall time of one VGG-19 HD iteration per network, figures printed.

`python bench/flow_bench.py [NODES ...]` (default 256 and 1024). Before the solver work
(one solve per flow event, one link saturated per round) the fat-tree took 14.7 s at 256
nodes and ~140 s at 1024; docs/baselines.md keeps the figures.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oddl.app.experiments.sweep import run_point  # noqa: E402
from oddl.controller.base.config import read_toml  # noqa: E402

NETWORKS = [
    {"name": "electrical", "kind": "electrical"},
    {"name": "fattree-3to1", "kind": "fattree", "hosts_per_leaf": 32, "spines": 16,
     "oversubscription": 3.0},
    {"name": "sipring", "kind": "sipring"},
    {"name": "topoopt", "kind": "topoopt"},
]


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [256, 1024]
    template = read_toml(ROOT / "hw_configs" / "grid-1024.toml")
    for n in sizes:
        for net in NETWORKS:
            t = time.perf_counter()
            row = run_point({"network": net, "model": "vgg19", "nodes": n,
                             "line_rate_gbps": 100.0, "template": template, "sweep": "bench",
                             "collective": "hd"})
            print(f"{n:5d} nodes {net['name']:13s} iteration {row['iteration_ms']:9.3f} ms "
                  f"flows {row['flows']:6d}  wall {time.perf_counter() - t:6.1f} s", flush=True)


if __name__ == "__main__":
    main()
