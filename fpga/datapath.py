"""Lightning's datapath as the host and the board exchange it: a model's layer streams
going down, and what the board answers (its count-action modules, the words a layer
played, the fabric's clocks) coming back.

The board answers in plain dicts and lists (they cross Pyro4 to a remote QICK board);
the driver takes them as these structs (`msgspec.convert`: a missing or mistyped field is
a clear error, not a KeyError three calls later), and the inference above reads the
structs only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec


class LayerStream(NamedTuple):
    """One layer's stream as the board holds it: which input feeds each modulator pair of
    each sample (-1: dark), and the weight codes beside them, both (samples, pairs)."""

    inputs: Any  # an integer array
    mags: Any  # an integer array, codes 0..255

    def wire(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "mags": self.mags}


class ModuleState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A count-action module as its STATUS and COUNT registers read."""

    armed: bool
    fired: bool
    fire_count: int
    count: int


class DatapathState(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's modules by name, and the fabric's clocks since power-on."""

    modules: dict[str, ModuleState]
    cycles_total: int


class ModelLoaded(DatapathState, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model loaded: its layers and the values a DAC holds for them."""

    layers: int
    values: int


class LayerPlayed(DatapathState, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A layer played: the words its stream holds, those it played (fewer: it stalled at
    the next, waiting for `waits_for`), and the fabric clocks it took."""

    words: int
    played: int
    cycles: int
    waits_for: str = ""


def answer(kind: type[msgspec.Struct], out: dict[str, Any], what: str) -> Any:
    """The board's answer `out` as `kind`; ValueError naming `what` and the field."""
    try:
        return msgspec.convert(out, kind, strict=True)
    except msgspec.ValidationError as e:
        raise ValueError(f"{what}: the board's answer: {e}") from None
