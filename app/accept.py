"""`oddl accept`: lock the testbed, (for emu) start the emulator, run the acceptance suite.

The suite is plain pytest (oddl.acceptance, kept in tests/acceptance, with its `oddl` plugin);
this module only decides what it runs against, holds the testbed lock for the duration,
and asks pytest for the JUnit XML beside the plugin's summary.json / summary.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oddl.app import registry
from oddl.app.experiments.results import package_versions
from oddl.app.session import session
from oddl.controller.base.config import Testbed


def suite_dir() -> Path:
    """Where the installed checks are (oddl.acceptance, kept in tests/acceptance): found,
    not imported, so the control plane does not depend on the suite."""
    spec = importlib.util.find_spec("oddl.acceptance")
    if spec is None or not spec.submodule_search_locations:
        raise AcceptError("the acceptance checks (oddl.acceptance) are not installed")
    return Path(next(iter(spec.submodule_search_locations)))


# --only names -> the check functions they select
CHECKS = {
    "reachable": "test_board_reachable",
    "identity": "test_identity",
    "registers": "test_register_readback",
    "tuning": "test_tuning_time",
    "routes": "test_wss_route",
    "loopback": "test_link_loopback",
    "control-rtt": "test_control_rtt",
    "countaction": "test_countaction_readback",
    "lightning": "test_lightning_accuracy",
    "lightning-inference": "test_lightning_inference",
}


class AcceptError(RuntimeError):
    pass


def check_only(only: list[str]) -> None:
    unknown = [o for o in only if o not in CHECKS]
    if unknown:
        raise AcceptError(f"--only: unknown check(s) {', '.join(unknown)} (known: "
                          f"{', '.join(CHECKS)})")


def pytest_args(config: Path, report: Path, only: list[str]) -> list[str]:
    suite = suite_dir()
    # importlib mode: the installed suite's folder never goes onto sys.path
    args = [str(suite), "--testbed", str(config), "--accept-report", str(report),
            f"--junitxml={report / 'junit.xml'}", "-o", "junit_family=xunit2",
            "-p", "no:cacheprovider", "-q", "-rfs", "--rootdir", str(suite),
            "--import-mode=importlib"]
    if only:
        args += ["-k", " or ".join(CHECKS[o] for o in only)]
    return args


def run(testbed_path: Path, tb: Testbed, backend: str, report: Path, only: list[str],
        faults: list[str], wait_s: float, say: Callable[[str], None],
        record: Path | None = None) -> int:
    """The suite's exit code: 0 all passed, 1 a check failed, 2 it could not run.
    `record`: every exchange with the devices onto that cassette (drivers/cassette.py)."""

    check_only(only)
    if faults and not (registry.kind(backend).faults_at_start
                       and not registry.serves(tb).devices):
        raise AcceptError("--fault is for --backend emu on a testbed it emulates privately "
                          "(real devices bring their own; an emulator already serving takes "
                          "faults at its control endpoint)")
    t0 = time.perf_counter()
    # emu on a testbed: a private emulated copy (nothing shared, nothing to lock); an emu
    # config (an emulator serving) and hw: the lock (TestbedBusy names the holder; a
    # refused run leaves no report folder)
    with session(testbed_path, tb, backend, f"oddl accept (pid {os.getpid()})",
                 faults=faults, wait_s=wait_s, say=say) as s:
        if s.testbed != testbed_path:
            say(f"emulated {tb.name}: {s.testbed}")
        report.mkdir(parents=True, exist_ok=True)
        header = {"kind": "accept", "argv": sys.argv[1:], "testbed_name": tb.name,
                  "testbed": s.testbed.read_text(), "only": only,
                  "packages": package_versions()}
        rc = _suite(s.testbed, report, only, record, header, say)
    d = _said(report, say)
    say(f"acceptance of {tb.name} ({backend}) took {time.perf_counter() - t0:.1f} s; "
        f"report: {report}")
    return {0: 0, 1: 1}.get(rc, 2) if d is not None else 2


def _suite(testbed: Path, report: Path, only: list[str], record: Path | None,
           header: dict[str, Any], say: Callable[[str], None]) -> int:
    """pytest on the suite, recording its device traffic onto `record` if given."""
    import pytest

    if record is None:
        return int(pytest.main(pytest_args(testbed, report, only)))
    rc = 2
    with registry.recording(record, header) as rec:
        try:
            rc = int(pytest.main(pytest_args(testbed, report, only)))
        finally:
            summary = report / "summary.json"
            rec.close({"rc": rc, "summary": json.loads(summary.read_text())
                       if summary.exists() else None})
    say(f"recorded {rec.events:,} exchanges with the devices to {record} "
        f"({record.stat().st_size / 1024:.0f} KiB)")
    return rc


def _said(report: Path, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The report's summary, its failures and its verdict said."""
    summary = report / "summary.json"
    if not summary.exists():
        return None
    d: dict[str, Any] = json.loads(summary.read_text())
    for c in d["checks"]:
        if c["outcome"] == "failed":
            say(f"FAIL {c['check']}: {c['message']}")
    say(f"{d['verdict']}: {d['counts']['passed']} passed, {d['counts']['failed']} "
        f"failed, {d['counts']['skipped']} skipped")
    return d


# figures measured on the host's clock, not read from a device: a replay paces them as
# recorded, to within this much (the rest are held exactly)
WALL_CLOCK = {"test_control_rtt": (0.5, 1.0),  # check -> (relative, absolute) tolerance
              "test_board_reachable": (0.5, 20.0)}


def replay_accept(player: Any, path: Path, report: Path, say: Callable[[str], None]) -> int:
    """An acceptance run again with every device served from `player`'s cassette: 0 the
    same checks, outcomes, messages and figures as recorded; 1 a divergence or a
    difference (each said)."""
    import pytest

    h = player.header
    recorded = (player.result or {}).get("summary")
    if recorded is None or not isinstance(h.get("testbed"), str):
        raise AcceptError(f"{path}: the recording was cut short (no result to compare)")
    report.mkdir(parents=True, exist_ok=True)
    testbed = report / "testbed.toml"  # the config the recorded suite ran on
    testbed.write_text(h["testbed"])
    say(f"replaying {path}: `oddl {' '.join(h.get('argv', []))}` on {h.get('testbed_name')}, "
        f"{sum(len(v) for v in player.by_dev.values()):,} exchanges with "
        f"{len(player.by_dev)} devices, no device reached")
    pytest.main(pytest_args(testbed, report, h.get("only") or []))
    got = _said(report, say)
    checks = differences(recorded, got) if got is not None else ["the suite did not run"]
    return differences_said(player, path, checks[:MAX_SAID] + (
        [f"and {len(checks) - MAX_SAID} more checks"] if len(checks) > MAX_SAID else []),
        say)


def differences_said(player: Any, path: Path, found: list[str],
                     say: Callable[[str], None]) -> int:
    """A replay's verdict, each difference on a DIFFERS line, the cause first (an event
    changed after it was recorded; the first request the recording does not hold), then
    what came out otherwise (`found`), then what was never asked for; 0 if none."""
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
                                  else "not as recorded"))
    return 1 if diffs else 0


MAX_SAID = 10  # checks that differ, said one by one


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
