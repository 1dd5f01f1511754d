"""`oddl replay CASSETTE`: a recorded command run again with every device served from its
cassette (drivers/cassette.py, docs/cassettes.md), and its result held to the recorded one.

An acceptance (`oddl accept --record`) replays through app/accept.py. A run (`oddl run
--record`) replays here: the recorded experiment and testbed are written to the report
directory, the run goes through the same `api.run` (stage 1 through the drivers, stage 2's
messages on a played bus, the drill's requests to a played endpoint), and every figure of
its result must come out as recorded.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
from oddl.app import registry
from oddl.app.accept import AcceptError, differences_said, replay_accept

# what a run's result says of the host, not of the devices: not compared (`at_ns`: when a
# fault began, on the host's monotonic clock)
HOST_FIELDS = {"wall_s", "run_dir", "at_ns"}
# what the controller times on its own clock (a fault found, recovered from, the time it
# cost, and what holds that time): held to the recording within this much
TIMED = {"detected_after_ns": 10e6, "recovered_after_ns": 10e6, "fault_time_s": 0.01,
         "training_time_s": 0.01}
TIMED_REL = {"ratio": 1e-5}


def replay(path: Path, report: Path, relaxed: bool, say: Callable[[str], None]) -> int:
    """0: as recorded; 1: a divergence or a difference (each said); AcceptError: the
    cassette cannot be played (exit 2)."""
    try:
        with registry.playing(path, relaxed) as player:
            kind = player.header.get("kind")
            if kind == "accept":
                return replay_accept(player, path, report, say)
            if kind == "run":
                return _replay_run(player, path, report, say)
            raise AcceptError(f"{path}: a cassette of {kind!r}: this oddl replays `oddl "
                              f"accept` and `oddl run`")
    except ValueError as e:  # the cassette cannot be played (it says why)
        raise AcceptError(str(e)) from None


def _replay_run(player: Any, path: Path, report: Path, say: Callable[[str], None]) -> int:
    from oddl.app import api

    h = player.header
    recorded = (player.result or {}).get("result")
    if recorded is None:
        raise AcceptError(f"{path}: the recording was cut short (no result to compare)")
    report.mkdir(parents=True, exist_ok=True)
    (report / "testbed.toml").write_text(h["testbed"])
    exp = tomllib.loads(h["experiment"])
    exp["testbed"] = "testbed.toml"  # the recorded one, beside it
    (report / "experiment.toml").write_text(tomli_w.dumps(exp))
    say(f"replaying {path}: `oddl {' '.join(h.get('argv', []))}`, "
        f"{sum(len(v) for v in player.by_dev.values()):,} exchanges with "
        f"{len(player.by_dev)} devices, no device reached")
    got: dict[str, Any] | None = None
    try:
        res = api.run(report / "experiment.toml", h["backend"], h.get("iterations"),
                      report / "run", say=say)
        got = res.to_json_obj()
    except Exception as e:  # what the replayed run raised is a difference, said
        say(f"the replayed run failed: {e}")
    diffs = [] if got is None else _compare("", recorded, got)
    if got is None:
        diffs.append(f"recorded a result, replayed none: {player.first or 'see above'}")
    return differences_said(player, path, diffs, say)


def _compare(at: str, a: Any, b: Any) -> list[str]:
    """Where two results differ (HOST_FIELDS aside)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys()) if k not in HOST_FIELDS
                for d in _compare(f"{at}.{k}" if at else k, a.get(k), b.get(k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _compare(f"{at}[{i}]", x, y)]
    key = at.rsplit(".", 1)[-1]
    if isinstance(a, int | float) and isinstance(b, int | float) and (
            abs(a - b) <= TIMED.get(key, 0.0) or
            abs(a - b) <= TIMED_REL.get(key, 0.0) * abs(a)):
        return []
    if a != b:
        return [f"{at}: recorded {json.dumps(a)}, replayed {json.dumps(b)}"]
    return []
