"""The kinds of fault, in one table: what a drill injects, what names its target, what
`--fault` takes after the kind, the fields it needs, and the diagnoses by which the
arbiter finds it; and the diagnoses, with what each makes a plan go round.

Config (`[[faults]]`), the drills (sim and the emulator's `--fault`), the CLI, the health
monitor and recovery all read these tables; nothing else lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Kind:
    name: str
    target: str  # what the target names: NODE, NODE/PORT, WSS, bus, broker, qick (a DAC)
    cli: str  # what `--fault NAME:` takes after the name
    needs: tuple[str, ...]  # the FaultSpec fields it must have
    found_as: tuple[str, ...]  # the diagnoses that are the arbiter's finding of it


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("dead-board", "NODE", "NODE", (), ("dead-board", "unresponsive")),
    Kind("dead-wss", "WSS", "WSS", (), ("dead-wss", "wss-route")),
    Kind("slow-tx", "NODE/PORT", "NODE/PORT:NS", ("tune_ns",), ("slow-tx",)),
    Kind("wss-route", "WSS", "WSS:IN/CH:OUT", ("input", "channel", "output"),
         ("dead-wss", "wss-route")),
    Kind("corrupt-link", "NODE/PORT", "NODE/PORT", (), ("corrupt-link",)),
    Kind("control-loss", "bus", "bus:DROP_PROBABILITY", (), ()),  # found by nobody: retried
    Kind("broker-restart", "broker", "broker", (), ("broker-restart",)),
    Kind("dac-not-ready", "qick", "DAC", ("dac",), ()),  # the QICK board's: Lightning fails
    Kind("dead-modulator", "qick", "DAC", ("dac",), ()),  # its modulator passes no light
)}
FAULT_KINDS = tuple(KINDS)
QICK_KINDS = tuple(k.name for k in KINDS.values() if k.target == "qick")  # the emulator's

# diagnosis -> what a plan goes round (None: recorded, or waited out, not planned round)
Avoided = Literal["node", "wss", "link"] | None
DIAGNOSES: dict[str, Avoided] = {
    "dead-board": "node", "unresponsive": "node", "dead-wss": "wss", "wss-route": "wss",
    "corrupt-link": "link", "slow-tx": None, "broker-restart": None}


def avoided(what: Avoided) -> tuple[str, ...]:
    """The diagnoses that make a plan go round a `what`."""
    return tuple(d for d, a in DIAGNOSES.items() if a == what)


def cli_help() -> str:
    """`--fault`'s syntax, every kind."""
    return " | ".join(f"{k.name}:{k.cli}" for k in KINDS.values())
