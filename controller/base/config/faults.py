"""A drill's faults (an experiment's `[[faults]]`, `--fault`): what each names, checked
against the testbed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

from oddl.controller.base.config.fields import (
    ConfigModel,
)
from oddl.controller.base.config.testbed import (
    Testbed,
)
from oddl.controller.base.faultkinds import FAULT_KINDS, KINDS
from pydantic import Field, model_validator

# a Literal of the catalogue's kinds, which pydantic checks; to the type checker a str
if TYPE_CHECKING:
    FaultKind: TypeAlias = str
else:
    FaultKind = Literal[FAULT_KINDS]


class FaultSpec(ConfigModel):
    """One fault of a drill: what breaks, where, when, and for how long (absent: for good).

    Extra fields by kind: slow-tx `tune_ns`; wss-route `input`, `channel`, `output` (light
    on that input and channel leaves at that output, though the table reads back right);
    control-loss `drop_probability` (and `delay_probability`, `max_extra_delay_ns`);
    dac-not-ready and dead-modulator `dac`."""

    kind: FaultKind
    target: str = Field(min_length=1, max_length=200)
    at_iteration: int | None = Field(default=None, ge=0, le=10_000_000)
    at_ms: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    duration_ms: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    tune_ns: int | None = Field(default=None, gt=0, le=10**12)
    input: int | None = Field(default=None, ge=0, le=4096)
    channel: int | None = Field(default=None, ge=0, le=512)
    output: int | None = Field(default=None, ge=0, le=4096)
    drop_probability: float = Field(default=0.0, ge=0, le=1)
    delay_probability: float = Field(default=0.0, ge=0, le=1)
    max_extra_delay_ns: float = Field(default=0.0, ge=0, le=1e12, allow_inf_nan=False)
    dac: int | None = Field(default=None, ge=0, le=64)

    @model_validator(mode="after")
    def _fields(self) -> FaultSpec:
        if self.at_iteration is not None and self.at_ms is not None:
            raise ValueError("give at most one of at_iteration and at_ms (neither: from the "
                             "start)")
        missing = [f for f in KINDS[self.kind].needs if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{self.kind} needs {', '.join(missing)}")
        if self.kind == "control-loss" and not (self.drop_probability
                                                or self.delay_probability):
            raise ValueError("control-loss needs drop_probability or delay_probability")
        return self

    @property
    def start_ms(self) -> float:
        return self.at_ms or 0.0

    def __str__(self) -> str:
        when = (f"at iteration {self.at_iteration}" if self.at_iteration is not None
                else f"at {self.start_ms:g} ms")
        span = f" for {self.duration_ms:g} ms" if self.duration_ms is not None else ""
        return f"{self.kind} {self.target} {when}{span}"


def fault_issues(faults: list[FaultSpec], tb: Testbed) -> list[tuple[str, str]]:
    """Every fault's target against the testbed: (field path, reason) pairs."""
    out: list[tuple[str, str]] = []
    nodes = {n.id: n for n in tb.nodes}
    wss = {w.id: w for w in tb.wss}
    groups = {(w.axis, w.index) for w in tb.wss}
    n_ch = len(tb.optical.wavelengths())
    for i, f in enumerate(faults):
        at = f"faults[{i}]"
        want = KINDS[f.kind].target
        node, _, port = f.target.partition("/")
        if want == "NODE":
            if f.target not in nodes:
                out.append((f"{at}.target", f"no node {f.target!r} in {tb.name}"))
        elif want == "NODE/PORT":
            if node not in nodes:
                out.append((f"{at}.target", f"no node {node!r} in {tb.name} (expected "
                                            f"NODE/PORT, e.g. {tb.nodes[0].id}/H)"))
            elif port not in ("H", "V"):
                out.append((f"{at}.target", f"no port {port!r} on {node}: H or V"))
            elif (("row", nodes[node].row) if port == "H" else ("col", nodes[node].col)
                  ) not in groups:
                out.append((f"{at}.target", f"{node} has no {port} port here (no WSS on it)"))
        elif want == "WSS":
            w = wss.get(f.target)
            if w is None:
                out.append((f"{at}.target", f"no WSS {f.target!r} in {tb.name}"))
            elif f.kind == "wss-route":
                for fld, v, lim in (("input", f.input, w.ports), ("output", f.output, w.ports),
                                    ("channel", f.channel, n_ch)):
                    if v is not None and v >= lim:
                        out.append((f"{at}.{fld}", f"{v} is outside {w.id} (0..{lim - 1})"))
        elif want in ("bus", "broker"):
            if f.target != want:
                out.append((f"{at}.target", f"a {f.kind} fault's target is {want!r}"))
        else:
            if tb.qick is None:
                out.append((f"{at}.kind", f"{tb.name} has no [qick] board"))
            elif f.dac not in tb.qick.dac_channels:
                out.append((f"{at}.dac", f"DAC {f.dac} is not one of the board's operand "
                                         f"DACs {list(tb.qick.dac_channels)}"))
    return out


OLD_FAULTS = ("the [faults] table is gone: a fault is now an entry of the [[faults]] list. "
              "Rewrite it as\n  [[faults]]\n  kind = \"control-loss\"\n  target = \"bus\"\n"
              "  drop_probability = ...\n  delay_probability = ...\n  max_extra_delay_ns = ...\n"
              "(docs/faults.md lists every kind)")
