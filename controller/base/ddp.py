"""Data parallelism as PyTorch's DistributedDataParallel runs it: gradients in buckets,
each all-reduced while the rest of backward still runs.

DDP (torch/nn/parallel/distributed.py and the reducer it drives) rebuilds its buckets
after the first iteration in the order the gradients became ready, which is the layers'
order reversed: a tensor joins the open bucket, and the bucket closes once it holds at
least its cap, 1 MiB for the first (`_DEFAULT_FIRST_BUCKET_BYTES`), `bucket_cap_mb` (25 MiB)
for every other. A bucket's all-reduce is launched when its last gradient is computed;
the all-reduces run one after another on one communication stream, beside the compute
stream; the optimiser step waits for the last. A layer's gradient is ready when backward,
which runs the layers last to first, has passed it.

The iteration here is `Overlap`: when forward ends, when backward ends, and each bucket's
bytes and ready time from the iteration's start. Layer times come from the model's layer
table (controller/base/layers.py): its FLOPs at an accelerator's sustained rate, or a
given compute time shared out in proportion to them. Not timed: the optimiser step (in
neither the table nor the model without overlap), and the gradient copies into buckets.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from oddl.controller.base.accelerators import ACCELERATORS
from oddl.controller.base.layers import LayerTable

MiB = 1 << 20
FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, in MiB
BUCKET_MB = 25.0  # DistributedDataParallel(bucket_cap_mb=25)
MAX_BUCKETS = 4096  # a 8.3 B-parameter model in 25 MiB buckets is 1,270
Ns = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]


CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                         "broadcast"]


class Bucket(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A bucket's gradient bytes, and when its last gradient is computed (ns after the
    iteration starts); a recorded step's collective may be another kind than DDP's
    all-reduce (controller/base/config/recorded.py)."""

    nbytes: Annotated[int, msgspec.Meta(ge=1, le=1 << 40)]
    ready_ns: Ns
    kind: CollectiveKind = "all_reduce"


class Overlap(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A data-parallel iteration whose all-reduces overlap backward: forward ends at
    `forward_ns`, backward at `compute_ns`; each bucket is all-reduced, in order, from its
    ready time. The controller hands it to the nodes with the job (JobSpec.overlap)."""

    forward_ns: Ns
    compute_ns: Ns
    buckets: Annotated[tuple[Bucket, ...], msgspec.Meta(max_length=MAX_BUCKETS)]
    optimizer_ns: Ns = 0  # the optimiser's step, after the last bucket (a recorded step's)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def problems(self) -> list[str]:
        """What makes it no iteration (a bucket ready outside backward, out of order)."""
        out = []
        if self.forward_ns > self.compute_ns:
            out.append(f"forward ends at {self.forward_ns} ns, after backward "
                       f"({self.compute_ns} ns)")
        last = 0
        for i, b in enumerate(self.buckets):
            if not last <= b.ready_ns <= self.compute_ns:
                out.append(f"bucket {i} is ready at {b.ready_ns} ns, outside {last} .. "
                           f"{self.compute_ns} ns")
            last = b.ready_ns
        return out


def layer_ns(table: LayerTable, batch: int, compute_ns: int | None = None,
             device: str | None = None) -> list[tuple[float, float]]:
    """Each layer's forward and backward time (ns) for `batch` samples: its FLOPs at the
    device's sustained rate, or `compute_ns` (forward and backward) shared out by FLOPs."""
    if (compute_ns is None) == (device is None):
        raise ValueError("give one of compute_ns or device")
    if device is not None:
        per_flop = 1e9 / ACCELERATORS[device].flops_per_s
    else:
        total = table.fwd_flops + table.bwd_flops
        if total == 0:
            raise ValueError(f"{table.model}'s table counts no FLOPs to share time out by")
        per_flop = (compute_ns or 0) / (batch * total)
    return [(x.fwd_flops * batch * per_flop, x.bwd_flops * batch * per_flop)
            for x in table.layers]


def ddp_overlap(table: LayerTable, batch: int, bytes_per_param: int = 4,
                bucket_mb: float = BUCKET_MB, first_bucket_mb: float = FIRST_BUCKET_MB,
                compute_ns: int | None = None, device: str | None = None) -> Overlap:
    """The iteration DDP runs for `batch` samples a rank (module docstring)."""
    times = layer_ns(table, batch, compute_ns, device)
    forward = sum(f for f, _b in times)
    # when backward has passed each layer (it runs them last to first)
    done = [0.0] * len(times)
    t = forward
    for i in range(len(times) - 1, -1, -1):
        t += times[i][1]
        done[i] = t
    end = round(t) if compute_ns is None else compute_ns
    caps = [round(first_bucket_mb * MiB), round(bucket_mb * MiB)]
    buckets: list[Bucket] = []
    size, ready = 0, 0.0
    for i in range(len(table.layers) - 1, -1, -1):
        for n in reversed(table.layers[i].tensors):  # a layer's tensors, in ready order
            size += n * bytes_per_param
            ready = done[i]
            if size >= caps[min(len(buckets), 1)]:
                buckets.append(Bucket(size, min(round(ready), end)))
                size = 0
    if size:
        buckets.append(Bucket(size, min(round(ready), end)))
    if len(buckets) > MAX_BUCKETS:
        raise ValueError(f"{len(buckets)} buckets of {bucket_mb} MiB: at most {MAX_BUCKETS}")
    return Overlap(round(forward), end, tuple(buckets))
