"""`oddl replay CASSETTE`: a recorded command run again with every device served from its
cassette (drivers/cassette.py, docs/cassettes.md), and its result held to the recorded one.

The recorded configs are written to the report directory and the command goes through its
own code: an acceptance through the installed suite (app/accept.py), a run through
`api.run` (stage 1 through the drivers, stage 2's messages on a played bus, the drill's
requests to a played endpoint). Each difference is said on a `DIFFERS` line, its cause
first.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
from oddl.app import registry
from oddl.app.accept import AcceptError, run_suite, summary_said
from oddl.controller.serving import lifecycle
from oddl.controller.serving.lifecycle import Stopped

# an acceptance's figures measured on the host's clock, not read from a device: held to
# the recording within this much (check -> relative, absolute); the rest exactly
WALL_CLOCK = {"test_board_reachable": (0.5, 20.0)}  # (test_control_rtt's are recorded)
MAX_SAID = 10  # checks that differ, said one by one
# what a run's result says of the host, not of the devices: not compared (`at_ns`: when a
# fault began, on the host's monotonic clock; how long after it the controller found it
# and recovered: the replay injects the fault at its own pace, but cannot deliver what
# the fault made the devices say sooner than it was recorded, so these are the replaying
# host's: 5 ms recorded came back as 693 ms on a loaded machine)
HOST_FIELDS = {"wall_s", "run_dir", "at_ns", "detected_after_ns", "recovered_after_ns"}
# what the controller times on its own clock (the time a fault cost, and the training
# time that holds it): held to the recording within this much
TIMED = {"fault_time_s": 0.01, "training_time_s": 0.01}
TIMED_REL = {"ratio": 1e-5}
Say = Callable[[str], None]


def replay(path: Path, report: Path, relaxed: bool, say: Say, key: bytes | None = None
           ) -> int:
    """0: as recorded; 1: a divergence or a difference (each said); AcceptError: the
    cassette cannot be played (exit 2)."""
    try:
        with registry.playing(path, relaxed, key) as player:
            h = player.header  # (its kind and fields' types checked as it was read)
            played = {"accept": _accept, "run": _run}[h["kind"]]
            if player.result is None:
                raise AcceptError(f"{path}: the recording was cut short (no result to "
                                  f"compare)")
            report.mkdir(parents=True, exist_ok=True)
            (report / "testbed.toml").write_text(h["testbed"])  # what it ran on
            span = max((ev["t"] for evs in player.by_dev.values() for ev in evs), default=0)
            say(f"replaying {path}: `oddl {' '.join(h['argv'])}`, "
                f"{sum(len(v) for v in player.by_dev.values()):,} exchanges with "
                f"{len(player.by_dev)} devices over {span:.1f} s (replayed at that pace), "
                f"no device reached")
            return _verdict(player, path, played(player, report, say), say)
    except ValueError as e:  # the cassette cannot be played (it says why)
        raise AcceptError(str(e)) from None
    except Stopped as e:  # Ctrl-C, SIGTERM: no verdict, and where what was done is
        if report.exists():
            e.notes.append(f"the replay's partial report is in {report}")
        raise


def _accept(player: Any, report: Path, say: Say) -> list[str]:
    """The acceptance again: each check that came out otherwise (a stop, which pytest
    takes for an interrupted session, is the stop it is: no verdict)."""
    run_suite(report / "testbed.toml", report, player.header.get("only") or [])
    if lifecycle.stopped_by is not None:
        raise Stopped(lifecycle.stopped_by)
    got = summary_said(report, say)
    recorded = player.result["summary"]  # (None: the recorded suite did not run either)
    if got is None or recorded is None:
        return [] if got is recorded else \
            [f"the suite did not run {'here' if got is None else 'when it was recorded'}"]
    checks = differences(recorded, got)
    return checks[:MAX_SAID] + ([f"and {len(checks) - MAX_SAID} more checks"]
                                if len(checks) > MAX_SAID else [])


def _run(player: Any, report: Path, say: Say) -> list[str]:
    """The run again: where its result differs."""
    from oddl.app import api

    h = player.header
    exp = tomllib.loads(h["experiment"])
    exp["testbed"] = "testbed.toml"  # the recorded one, beside it
    (report / "experiment.toml").write_text(tomli_w.dumps(exp))
    try:
        res = api.run(report / "experiment.toml", h["backend"], h.get("iterations"),
                      report / "run", say=say)
    except Exception as e:  # what the replayed run raised is a difference, said
        if lifecycle.stopped_by is not None:  # (a stop that became an error on its way)
            raise Stopped(lifecycle.stopped_by) from None
        return [f"recorded a result, the replay failed: {e}"]
    # the replaying host's controller loop, running late, times a fault late by as much
    lag_ms = max((n.stats.get("loop_lag_ms", {}).get("controller", 0.0)
                  for n in res.networks.values()), default=0.0)
    if lag_ms:
        say(f"replay: this host's controller loop ran up to {lag_ms:g} ms late: what the "
            f"controller times is held to the recording within that much more")
    return _compare("", player.result["result"], res.to_json_obj(), lag_ms / 1e3)


def _verdict(player: Any, path: Path, found: list[str], say: Say) -> int:
    """Each difference on a DIFFERS line, the cause first (an event changed after it was
    recorded; the first request the recording does not hold), then what came out
    otherwise (`found`), then what was never asked for; 0 if none."""
    diffs = [f"changed since it was recorded: {a}" for a in player.altered]
    if (d := player.first) is not None:
        diffs.append(f"{d}; asked by\n{d.stack}")
    diffs += found
    if left := player.left():
        diffs.append("recorded exchanges the replay never asked for: " + ", ".join(
            f"{dev} {n}" for dev, n in sorted(left.items())))
    for line in diffs:
        say(f"DIFFERS {line}")
    say(f"replay of {path}: " + ("the same result as recorded" if not diffs
                                  else "not as recorded") + f" ({player.signature})")
    return 1 if diffs else 0


def differences(recorded: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What a replayed acceptance says otherwise than the recorded one: each check's
    outcome, message and figures (`WALL_CLOCK`'s: their figures within the tolerance, and
    then their outcome and message, which quote the figures, not held)."""
    out = []
    was = {c["check"]: c for c in recorded["checks"]}
    now = {c["check"]: c for c in got["checks"]}
    for name in sorted(was.keys() | now.keys()):
        a, b = was.get(name), now.get(name)
        if a is None or b is None:
            out.append(f"{name}: {'not replayed' if b is None else 'not recorded'}")
            continue
        rel, tol = WALL_CLOCK.get(name.split("[")[0], (0.0, 0.0))
        figures = [f"{name}: {fa['name']} recorded {fa['value']} {fa['unit']}, replayed "
                   f"{fb['value']} {fb['unit']}"
                   for fa, fb in zip(a["figures"], b["figures"], strict=False)
                   if fa != fb and not (rel and fa["name"] == fb["name"] and isinstance(
                       fa["value"], float) and isinstance(fb["value"], float) and abs(
                       fa["value"] - fb["value"]) <= max(tol, rel * abs(fa["value"])))]
        if len(a["figures"]) != len(b["figures"]):
            figures.append(f"{name}: {len(a['figures'])} figures recorded, "
                           f"{len(b['figures'])} replayed")
        # a check timed on the host's clock is judged by its figures: near its bound, the
        # same figures within the tolerance may pass once and fail once
        if (a["outcome"], a["message"]) != (b["outcome"], b["message"]) and \
                (not rel or figures or not a["figures"]):
            out.append(f"{name}: recorded {a['outcome']} {a['message']!r}, replayed "
                       f"{b['outcome']} {b['message']!r}")
            continue
        out += figures
    return out


def _without_host_lag(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any],
                                                                     dict[str, Any]]:
    """Two networks' results without what the host's lateness says: `host_lag_ms` (how
    late the node programs' loops ran, 9 ms recorded came back as 8) and, where either
    side has it, the verdict `disturbed`, which the rest of the disturbance (compared)
    and the control messages (compared) decide otherwise."""
    da, db = a.get("disturbance"), b.get("disturbance")
    if not (isinstance(da, dict) and isinstance(db, dict)) or \
            "host_lag_ms" not in da.keys() | db.keys():
        return a, b

    def bare(r: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k != "disturbed"} | {
            "disturbance": {k: v for k, v in d.items() if k != "host_lag_ms"}}
    return bare(a, da), bare(b, db)


def _compare(at: str, a: Any, b: Any, lag_s: float = 0.0) -> list[str]:
    """Where two run results differ (HOST_FIELDS aside, TIMED within their tolerance,
    widened by `lag_s`, how late the replaying controller's loop ran)."""
    if isinstance(a, dict) and isinstance(b, dict):
        a, b = _without_host_lag(a, b)
        return [d for k in sorted(a.keys() | b.keys()) if k not in HOST_FIELDS
                for d in _compare(f"{at}.{k}" if at else k, a.get(k), b.get(k), lag_s)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _compare(f"{at}[{i}]", x, y, lag_s)]
    key = at.rsplit(".", 1)[-1]
    slack = lag_s * (1e9 if key.endswith("_ns") else 1.0) if key in TIMED else 0.0
    if isinstance(a, int | float) and isinstance(b, int | float) and (
            abs(a - b) <= TIMED.get(key, 0.0) + slack or
            abs(a - b) <= TIMED_REL.get(key, 0.0) * abs(a)):
        return []
    if a != b:
        return [f"{at}: recorded {json.dumps(a)}, replayed {json.dumps(b)}"]
    return []
