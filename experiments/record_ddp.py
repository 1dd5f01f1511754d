"""Record a real data-parallel training step for `oddl run` (`[workload] torch_trace`): two
ranks of PyTorch's DistributedDataParallel on this machine's CPU (gloo, on 127.0.0.1),
profiled with torch.profiler, rank 0's step written as the Chrome trace JSON it exports.

    pip install torch==2.13.0
    python experiments/record_ddp.py OUT.json [--batch 64] [--steps 4] [--bucket-mb 1]

The model is the PyTorch examples' MNIST network (two convolutions, two linear layers:
1.2 M parameters) on random 28 x 28 images: what is recorded is how the step runs
(forward, backward, the buckets' all-reduces launched as their gradients are ready, the
optimiser), not what it learns. The profiler records from the third step on (DDP rebuilds
its buckets in gradient order after the first), and the last step recorded is the one
oddl takes. experiments/ddp-mnist-cpu.json was written by this script.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any


def _net() -> Any:
    from torch import nn

    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _rank(rank: int, world: int, port: int, out: str, batch: int, steps: int,
          bucket_mb: float) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)  # one core a rank: the two ranks share a 2-core machine
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.manual_seed(rank)
        ddp = nn.parallel.DistributedDataParallel(_net(), bucket_cap_mb=bucket_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=1, warmup=1, active=steps - 2)) as prof:
            for _ in range(steps):
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                prof.step()
        if rank == 0:
            prof.export_chrome_trace(out)
        # both ranks tear down together: a rank that destroyed its group while the other
        # still exported had once aborted in Gloo's teardown (SIGABRT, not reproduced)
        dist.barrier()
        del ddp
    finally:
        dist.destroy_process_group()


def record(out: Path, batch: int = 64, steps: int = 4, bucket_mb: float = 1.0) -> Path:
    """Run the two ranks and write rank 0's trace to `out`."""
    import torch.multiprocessing as mp

    if steps < 3:
        raise ValueError("at least 3 steps: DDP's buckets settle after the first")
    with socket.socket() as s:  # a free port on the loopback, for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank, args=(2, port, str(out), batch, steps, bucket_mb), nprocs=2, join=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    a = ap.parse_args()
    print(record(a.out, a.batch, a.steps, a.bucket_mb), file=sys.stderr)


if __name__ == "__main__":
    main()
