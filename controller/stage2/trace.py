"""Timelines of stage 2: what each O-NIC port did, the control messages between them, the
count-action firings, as Chrome trace-event JSON (Perfetto and chrome://tracing open it).

The control units record `TraceRow`s while their job's first `trace_iterations` run, in
every back end: in process (sim), or in each `oddl node`, which ships them to the
controller with its iteration reports (emu, hw). The controller pairs each message's send
with its receipt (an arrow from sender to receiver) and writes one file.

Times are each host's clock: virtual ns in sim; in emu and hw a node's monotonic clock
(one clock on one emulator host; across a lab's hosts, only as close as their clocks).
A port's tuning is drawn for the testbed's tuning time (the control unit is not told when
the channel locks); a slow transmitter shows as a longer "sending" slice.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from oddl.controller.base.access import NAME_PATTERN

REQUESTING, WAITING, TUNING, SENDING = "requesting", "waiting for grant", "tuning", "sending"
MAX_ROWS = 50_000  # per iteration report a node may send (a few MB of JSON)

_Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=64)]
_Short = Annotated[str, msgspec.Meta(max_length=32)]
_Time = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]


class TraceRow(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One event of one node.

    state: `port` was in state `what` from t0 to t1, for flow/hop (to `peer`)
    send:  `node` sent message `what` (REQUEST, ...) to `peer` at t0, for flow/hop
    recv:  `node` took message `what` from `peer` at t0
    fire:  count-action module `what` of `node` fired at t0
    phase: `node`'s rank was in phase `what` of its schedule (a tensor all-reduce, a
           pipeline transfer, the data-parallel all-reduce, compute) from t0 to t1; with
           port "compute", its compute stream (forward, backward) beside them
    """

    kind: Literal["state", "send", "recv", "fire", "phase"]
    node: _Name
    port: _Short
    what: _Short
    t0: _Time
    t1: _Time = 0
    flow: Annotated[int, msgspec.Meta(ge=-1, le=1 << 62)] = -1
    hop: Annotated[int, msgspec.Meta(ge=-1, le=64)] = -1
    peer: Annotated[str, msgspec.Meta(max_length=64)] = ""


class Tracer:
    """One host's recorder. `on` is switched by the job runner per iteration; rows wait
    until the host reports its iteration (`drain`)."""

    __slots__ = ("dropped", "on", "rows")

    def __init__(self) -> None:
        self.on = False
        self.rows: list[TraceRow] = []
        self.dropped = 0  # rows over MAX_ROWS in one report: counted, not sent

    def add(self, row: TraceRow) -> None:
        if len(self.rows) < MAX_ROWS:
            self.rows.append(row)
        else:
            self.dropped += 1

    def drain(self) -> list[TraceRow]:
        rows, self.rows = self.rows, []
        return rows


@dataclass
class ChromeTrace:
    """The rows of a run, per network, and the iterations they belong to; written as one
    Chrome trace-event file (a process per node, a thread per port and one for control)."""

    rows: dict[str, list[TraceRow]] = field(default_factory=lambda: defaultdict(list))
    iterations: dict[str, list[tuple[int, int, int]]] = field(
        default_factory=lambda: defaultdict(list))

    def events(self) -> list[dict[str, Any]]:
        ev: list[dict[str, Any]] = []
        pids: dict[tuple[str, str], int] = {}
        tids = {"H": 1, "V": 2, "control": 3, "iterations": 0}
        named: set[tuple[int, int]] = set()
        starts = [t for its in self.iterations.values() for _, t, _ in its]
        base = min(starts, default=0)

        def us(t: int) -> float:
            return (t - base) / 1e3

        def where(net: str, node: str, track: str) -> dict[str, Any]:
            key = (net, node)
            if key not in pids:
                pids[key] = len(pids) + 1
                ev.append({"ph": "M", "name": "process_name", "pid": pids[key],
                           "args": {"name": f"{net} {node}"}})
                ev.append({"ph": "M", "name": "process_sort_index", "pid": pids[key],
                           "args": {"sort_index": pids[key]}})
            pid, tid = pids[key], tids.setdefault(track, len(tids))
            if (pid, tid) not in named:
                named.add((pid, tid))
                ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": track if track in ("control", "iterations",
                                                                "phases", "compute")
                                    else f"port {track}"}})
            return {"pid": pid, "tid": tid}

        arrow = 0
        for net in self.iterations:
            for i, t0, t1 in self.iterations[net]:
                ev.append({"ph": "X", "name": f"iteration {i}", "ts": us(t0),
                           "dur": (t1 - t0) / 1e3, **where(net, "job", "iterations")})
            sends: dict[tuple[str, str, str, int, int], list[tuple[int, dict[str, Any]]]] = \
                defaultdict(list)
            for r in sorted(self.rows[net], key=lambda r: r.t0):
                args = {"flow": r.flow, "hop": r.hop} if r.flow >= 0 else {}
                if r.kind == "state":
                    ev.append({"ph": "X", "name": r.what, "ts": us(r.t0),
                               "dur": (r.t1 - r.t0) / 1e3, "cat": "port",
                               "args": {**args, "to": r.peer}, **where(net, r.node, r.port)})
                elif r.kind == "phase":
                    ev.append({"ph": "X", "name": r.what, "ts": us(r.t0),
                               "dur": (r.t1 - r.t0) / 1e3, "cat": "phase",
                               **where(net, r.node, r.port or "phases")})
                elif r.kind == "fire":
                    ev.append({"ph": "i", "s": "t", "name": f"count-action {r.what} fired",
                               "ts": us(r.t0), "cat": "count-action",
                               **where(net, r.node, "control")})
                elif r.kind == "send":
                    e = {"ph": "X", "name": f"{r.what} → {r.peer}", "ts": us(r.t0),
                         "dur": 0.001, "cat": "control", "args": {**args},
                         **where(net, r.node, "control")}
                    ev.append(e)
                    sends[(r.what, r.node, r.peer, r.flow, r.hop)].append((r.t0, e))
                else:  # recv: the latest unanswered send of it (a lost repeat stays alone)
                    cands = sends.get((r.what, r.peer, r.node, r.flow, r.hop), [])
                    e = {"ph": "X", "name": f"{r.what} ← {r.peer}", "ts": us(r.t0),
                         "dur": 0.001, "cat": "control", "args": {**args},
                         **where(net, r.node, "control")}
                    ev.append(e)
                    k = next((k for k in range(len(cands) - 1, -1, -1)
                              if cands[k][0] <= r.t0), None)
                    if k is None:
                        continue
                    t_sent, s = cands.pop(k)
                    arrow += 1
                    ev.append({"ph": "s", "id": arrow, "name": r.what, "cat": "control",
                               "ts": s["ts"], "pid": s["pid"], "tid": s["tid"]})
                    ev.append({"ph": "f", "bp": "e", "id": arrow, "name": r.what,
                               "cat": "control", "ts": e["ts"], "pid": e["pid"],
                               "tid": e["tid"]})
                    e["args"]["latency_ns"] = r.t0 - t_sent
        return ev

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"traceEvents": self.events(), "displayTimeUnit": "ns"}))
        return path


@dataclass
class Timeline:
    """What `oddl run --trace` asks for: the first `iterations` of every network."""

    iterations: int
    chrome: ChromeTrace = field(default_factory=ChromeTrace)
