"""Faults on the modelled testbed: a drill's `[[faults]]` injected in (virtual) time.

The same `FaultSpec`s drive the sim back end (in virtual time, at an iteration or an
instant) and `oddl emulate` (from the start with `--fault`, or mid-run through its control
endpoint). What each does to the models:

    dead-board NODE             the board and its node program are gone: no light, no
                                control message, no heartbeat (in emulation: no server)
    dead-wss WSS                the WSS answers nothing and passes no light
    slow-tx NODE/PORT           that transmitter takes `tune_ns` to tune
    wss-route WSS               light on (input, channel) leaves at `output`, though the
                                table reads back right
    corrupt-link NODE/PORT      every transfer into that receiver fails its CRC
    control-loss bus            control messages dropped (and delayed) at random
    broker-restart broker       the broker is gone: nothing crosses the bus
    dac-not-ready qick          the QICK board's DAC never raises its valid flag (emulator)
    dead-modulator qick         the modulator on that QICK DAC passes no light (emulator)

`--fault` takes them as strings, KIND:TARGET[:ARGS]: slow-tx:NODE/PORT:NS,
wss-route:WSS:IN/CH:OUT, control-loss:bus:P, dac-not-ready:DAC, dead-modulator:DAC; the
others KIND:TARGET.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from oddl.controller.base.config import FaultSpec, Testbed, fault_issues
from oddl.controller.base.faultkinds import FAULT_KINDS, KINDS, QICK_KINDS
from oddl.controller.service.backend import Injected
from oddl.controller.service.drill import DrillPlan
from pydantic import ValidationError

log = logging.getLogger(__name__)


class FaultSpecError(ValueError):
    pass


def parse_fault(spec: str, tb: Testbed) -> FaultSpec:
    """A `--fault` string as the FaultSpec it stands for (present from the start)."""
    kind, _, rest = spec.partition(":")
    if kind not in FAULT_KINDS:
        raise FaultSpecError(f"fault {spec!r}: unknown kind {kind!r} (known: "
                             f"{', '.join(FAULT_KINDS)})")
    parts = rest.split(":")
    kw: dict[str, Any] = {"kind": kind, "target": parts[0]}
    try:
        if kind == "slow-tx" and len(parts) == 2:
            kw["tune_ns"] = int(parts[1])
        elif kind == "wss-route" and len(parts) == 3:
            inp, ch = parts[1].split("/")
            kw |= {"input": int(inp), "channel": int(ch), "output": int(parts[2])}
        elif kind == "control-loss" and len(parts) == 2:
            kw["drop_probability"] = float(parts[1])
        elif kind in QICK_KINDS and len(parts) == 1:
            kw |= {"target": "qick", "dac": int(parts[0])}
        elif len(parts) != 1 or kind in ("slow-tx", "wss-route", "control-loss"):
            raise ValueError
        f = FaultSpec(**kw)
    except (ValueError, ValidationError):
        raise FaultSpecError(f"fault {spec!r}: expected {kind}:{KINDS[kind].cli}") from None
    issues = fault_issues([f], tb)
    if issues:
        raise FaultSpecError(f"fault {spec!r}: " + "; ".join(r for _p, r in issues))
    return f


class Drill:
    """Injects a scenario into a built sim world (sim.backend.World) on its clock."""

    def __init__(self, world: Any, clock: Any, faults: list[FaultSpec],
                 retries: Callable[[], int] = lambda: 0,
                 effect: Callable[[FaultSpec, bool], None] = lambda f, on: None) -> None:
        self.world, self.clock, self.faults = world, clock, list(faults)
        self.retries = retries  # the control units' REQUEST retries so far
        # what a fault does beyond the models, by whoever hosts them: a dead board's node
        # program is gone too (sim, emulator); the broker stops (emulator)
        self.effect = effect
        self.injected: list[Injected] = []
        self._retries0: dict[int, int] = {}
        self.plan = DrillPlan(self.faults, clock, self.inject)
        self.arm, self.at_iteration = self.plan.arm, self.plan.at_iteration
        for f in self.faults:
            if f.kind in QICK_KINDS:
                raise FaultSpecError(f"{f}: the QICK board's faults are the emulator's "
                                     f"(`oddl emulate --fault {f.kind}:DAC`)")

    def inject(self, f: FaultSpec) -> None:
        now = self.clock.now_ns()
        self.injected.append(Injected(f, now))
        self._retries0[id(f)] = self.retries()
        log.warning("drill: %s injected at %.3f ms", f, now / 1e6)
        self._set(f, True)
        if f.duration_ms is not None:
            self.clock.call_later_ns(round(f.duration_ms * 1e6), self.revert, f)

    def revert(self, f: FaultSpec) -> None:
        x = next(x for x in self.injected if x.spec is f)
        if x.until_ns is not None:  # over already (by hand, before its duration ran out)
            return
        x.until_ns = self.clock.now_ns()
        self._close(x)
        log.warning("drill: %s over at %.3f ms", f, x.until_ns / 1e6)
        self._set(f, False)

    def last_change_ns(self) -> int | None:
        """When a fault last began or ended (None: none has): its evidence may still wait
        in a register until the watch's next reading of it."""
        return max((x.at_ns if x.until_ns is None else x.until_ns for x in self.injected),
                   default=None)

    def _close(self, x: Injected) -> None:
        x.retries = self.retries() - self._retries0.get(id(x.spec), 0)

    def finish(self) -> None:
        """The run ends: faults still in force have their retries counted so far."""
        for x in self.injected:
            if x.until_ns is None:
                self._close(x)

    def _set(self, f: FaultSpec, on: bool) -> None:
        w = self.world
        fabric, bus = w.fabric, w.bus
        node, _, port = f.target.partition("/")
        if f.kind == "dead-board":
            (fabric.dead.add if on else fabric.dead.discard)(node)
            (bus.dead.add if on else bus.dead.discard)(node)
        elif f.kind == "dead-wss":
            fabric.wss[f.target].dead = on
        elif f.kind == "slow-tx":
            if on:
                fabric.tune_override[(node, port)] = f.tune_ns
            else:
                fabric.tune_override.pop((node, port), None)
        elif f.kind == "wss-route":
            mis = fabric.wss[f.target].misroute
            if on:
                mis[(f.input, f.channel)] = f.output
            else:
                mis.pop((f.input, f.channel), None)
        elif f.kind == "corrupt-link":
            (fabric.corrupt.add if on else fabric.corrupt.discard)((node, port))
        elif f.kind == "control-loss":
            bus.set_loss(*((f.drop_probability, f.delay_probability, f.max_extra_delay_ns)
                           if on else (0.0,)))
        elif f.kind == "broker-restart":
            bus.down = on
        self.effect(f, on)


def install(world: Any, clock: Any, faults: list[FaultSpec],
            retries: Callable[[], int] = lambda: 0,
            effect: Callable[[FaultSpec, bool], None] = lambda f, on: None) -> Drill:
    """Faults present from the start (the emulator's `--fault`): injected at once."""
    drill = Drill(world, clock, [f for f in faults if f.kind not in QICK_KINDS], retries,
                  effect)
    for f in drill.faults:
        drill.inject(f)
    return drill
