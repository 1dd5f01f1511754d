"""Models layer by layer, as PyTorch counts them from the models' own definitions.

Each shipped table (`layer_tables/MODEL.json`, written by experiments/layer_tables.py on
the meta device with PyTorch's FLOP counter) lists, in the model's registration order,
every layer's parameter tensors and its forward and backward FLOPs for one sample. What a
data-parallel iteration looks like follows from it (controller/base/ddp.py): when each
gradient is ready in backward, and so which bucket can be all-reduced while backward runs.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Annotated

import msgspec

MAX_TABLE_BYTES = 1 << 20  # the largest shipped table is 70 kB
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]


class Layer(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One layer: its name in the model, the element counts of the parameter tensors it
    owns (in registration order), and its FLOPs for one sample, forward and backward."""

    name: Annotated[str, msgspec.Meta(max_length=200)]
    tensors: Annotated[tuple[Count, ...], msgspec.Meta(max_length=64)]
    fwd_flops: Count
    bwd_flops: Count

    @property
    def params(self) -> int:
        return sum(self.tensors)


class LayerTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model's layers, where they come from, and what one sample is."""

    model: Annotated[str, msgspec.Meta(max_length=32)]
    source: Annotated[str, msgspec.Meta(max_length=1000)]
    sample: Annotated[str, msgspec.Meta(max_length=200)]
    params: Count
    layers: Annotated[tuple[Layer, ...], msgspec.Meta(min_length=1, max_length=10_000)]

    @property
    def fwd_flops(self) -> int:
        """Forward FLOPs of one sample."""
        return sum(x.fwd_flops for x in self.layers)

    @property
    def bwd_flops(self) -> int:
        return sum(x.bwd_flops for x in self.layers)

    def problems(self) -> list[str]:
        """What makes a table inconsistent (its parameter count not its layers' sum)."""
        total = sum(x.params for x in self.layers)
        return [] if total == self.params else \
            [f"params: {self.params:,} where its layers hold {total:,}"]


def layer_models() -> tuple[str, ...]:
    """The models a table ships for."""
    folder = resources.files("oddl.controller.base") / "layer_tables"
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")))


@functools.lru_cache(maxsize=32)
def layer_table(model: str) -> LayerTable:
    """The shipped table of `model`; ValueError if none ships."""
    if model not in layer_models():
        raise ValueError(f"no layer table for {model!r}; tables ship for "
                         f"{', '.join(layer_models())}")
    f = resources.files("oddl.controller.base") / "layer_tables" / f"{model}.json"
    with f.open("rb") as fh:
        data = fh.read(MAX_TABLE_BYTES + 1)
    if len(data) > MAX_TABLE_BYTES:
        raise ValueError(f"{model}.json: over {MAX_TABLE_BYTES} bytes")
    table = msgspec.json.decode(data, type=LayerTable)
    if table.problems():
        raise ValueError(f"{model}.json: {'; '.join(table.problems())}")
    return table
