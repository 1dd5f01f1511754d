"""Device faults for the emulator (acceptance tests must catch each one).

    slow-tx:NODE/PORT:NS         that transmitter takes NS ns to tune
    wss-route:WSS:IN/CH:OUT      light on (IN, CH) leaves at OUT, though the table reads back right
    dead-board:NODE              the board's server never answers
    corrupt-link:NODE/PORT       every transfer into that receiver fails its CRC
    dac-not-ready:DAC            the QICK board's DAC never raises its valid flag
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oddl.controller.config import Testbed


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str  # node, node/port or WSS id
    args: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}" + "".join(f":{a}" for a in self.args)


_SPECS = {
    "slow-tx": re.compile(r"^(?P<node>[^/:]+)/(?P<port>[HV]):(?P<ns>\d+)$"),
    "wss-route": re.compile(r"^(?P<wss>[^:]+):(?P<inp>\d+)/(?P<ch>\d+):(?P<out>\d+)$"),
    "dead-board": re.compile(r"^(?P<node>[^/:]+)$"),
    "corrupt-link": re.compile(r"^(?P<node>[^/:]+)/(?P<port>[HV])$"),
    "dac-not-ready": re.compile(r"^(?P<dac>\d+)$"),
}


def parse_fault(spec: str, tb: Testbed) -> Fault:
    kind, _, rest = spec.partition(":")
    rx = _SPECS.get(kind)
    if rx is None:
        raise FaultSpecError(f"fault {spec!r}: unknown kind {kind!r} (known: "
                             f"{', '.join(_SPECS)})")
    m = rx.match(rest)
    if m is None:
        raise FaultSpecError(f"fault {spec!r}: expected {kind}:" + {
            "slow-tx": "NODE/PORT:NS", "wss-route": "WSS:IN/CH:OUT",
            "dead-board": "NODE", "corrupt-link": "NODE/PORT", "dac-not-ready": "DAC"}[kind])
    g = m.groupdict()
    nodes = {n.id for n in tb.nodes}
    if "node" in g and g["node"] not in nodes:
        raise FaultSpecError(f"fault {spec!r}: no node {g['node']!r} in {tb.name}")
    if kind == "slow-tx":
        return Fault(kind, f"{g['node']}/{g['port']}", (int(g["ns"]),))
    if kind == "wss-route":
        w = {x.id: x for x in tb.wss}.get(g["wss"])
        if w is None:
            raise FaultSpecError(f"fault {spec!r}: no WSS {g['wss']!r} in {tb.name}")
        inp, ch, out = int(g["inp"]), int(g["ch"]), int(g["out"])
        if not (inp < w.ports and out < w.ports and ch < len(tb.optical.wavelengths())):
            raise FaultSpecError(f"fault {spec!r}: port or channel outside {w.id}")
        return Fault(kind, g["wss"], (inp, ch, out))
    if kind == "dac-not-ready":
        if tb.qick is None:
            raise FaultSpecError(f"fault {spec!r}: {tb.name} has no [qick] board")
        dac = int(g["dac"])
        if dac not in tb.qick.dac_channels:
            raise FaultSpecError(f"fault {spec!r}: DAC {dac} is not one of the board's "
                                 f"operand DACs {list(tb.qick.dac_channels)}")
        return Fault(kind, "qick", (dac,))
    if kind == "corrupt-link":
        return Fault(kind, f"{g['node']}/{g['port']}")
    return Fault(kind, g["node"])


def apply_faults(world: object, faults: list[Fault]) -> None:
    """Install faults into a built sim world (sim.backend.SimTestbed)."""
    fabric = world.fabric  # type: ignore[attr-defined]
    for f in faults:
        if f.kind == "slow-tx":
            node, port = f.target.split("/")
            fabric.tune_override[(node, port)] = f.args[0]
        elif f.kind == "wss-route":
            inp, ch, out = f.args
            fabric.wss[f.target].misroute[(inp, ch)] = out
        elif f.kind == "corrupt-link":
            node, port = f.target.split("/")
            fabric.corrupt.add((node, port))
        # dead-board is the emulator's business: it does not start that server
