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


AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
# the suite's verdict when every check skipped (its plugin's summary), and its exit code
NOTHING_CHECKED, NOTHING_CHECKED_EXIT = "NOTHING CHECKED", 4


def pytest_args(config: Path, report: Path, only: list[str]) -> list[str]:
    suite = suite_dir()
    # importlib mode: the installed suite's folder never goes onto sys.path
    # `-c` an empty config: the settings of a project around the report or the suite (a
    # checkout's pyproject: `-n 4 --dist loadscope`) are none of the suite's
    args = [str(suite), "-c", os.devnull, "--testbed", str(config), "--accept-report",
            str(report),
            f"--junitxml={report / 'junit.xml'}", "-o", "junit_family=xunit2",
            "-p", "no:cacheprovider", "-p", "oddl.acceptance.plugin", "-q", "-rfs",
            "--rootdir", str(suite), "--import-mode=importlib"]
    if only:
        args += ["-k", " or ".join(CHECKS[o] for o in only)]
    return args


def run_suite(testbed: Path, report: Path, only: list[str]) -> int:
    """pytest on the acceptance suite with its own plugin only, not every pytest plugin
    installed beside oddl (one that reorders or reruns tests would change a verdict; their
    imports took a second of CPU)."""
    import pytest

    before = os.environ.get(AUTOLOAD)
    os.environ[AUTOLOAD] = "1"
    try:
        return int(pytest.main(pytest_args(testbed, report, only)))
    finally:
        if before is None:
            del os.environ[AUTOLOAD]
        else:
            os.environ[AUTOLOAD] = before


def run(testbed_path: Path, tb: Testbed, backend: str, report: Path, only: list[str],
        faults: list[str], wait_s: float, say: Callable[[str], None],
        record: Path | None = None, key: bytes | None = None) -> int:
    """The suite's exit code: 0 all passed, 1 a check failed, 2 it could not run, 4 every
    check skipped.
    `record`: every exchange with the devices onto that cassette (drivers/cassette.py),
    signed with `key` if given."""

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
        rc = _suite(s.testbed, report, only, record, header, say, key)
    d = summary_said(report, say)
    say(f"acceptance of {tb.name} ({backend}) took {time.perf_counter() - t0:.1f} s; "
        f"report: {report}")
    if d is None:
        return 2
    if rc == 0 and d["verdict"] == NOTHING_CHECKED:
        return NOTHING_CHECKED_EXIT  # (no pass: every check skipped, each said why)
    return {0: 0, 1: 1}.get(rc, 2)


def _suite(testbed: Path, report: Path, only: list[str], record: Path | None,
           header: dict[str, Any], say: Callable[[str], None], key: bytes | None) -> int:
    """pytest on the suite, recording its device traffic onto `record` if given."""
    if record is None:
        return run_suite(testbed, report, only)
    rc = 2
    with registry.recording(record, header, key) as rec:
        try:
            rc = run_suite(testbed, report, only)
        finally:
            summary = report / "summary.json"
            say(rec.close({"rc": rc, "summary": json.loads(summary.read_text())
                           if summary.exists() else None}))
    return rc


def summary_said(report: Path, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The report's summary, its failures and its verdict said."""
    summary = report / "summary.json"
    if not summary.exists():
        return None
    d: dict[str, Any] = json.loads(summary.read_text())
    for c in d["checks"]:  # (with nothing checked, why each check was not)
        if c["outcome"] == "failed" or d["verdict"] == NOTHING_CHECKED:
            say(f"{'FAIL' if c['outcome'] == 'failed' else 'SKIP'} {c['check']}: "
                f"{c['message']}")
    say(f"{d['verdict']}: {d['counts']['passed']} passed, {d['counts']['failed']} "
        f"failed, {d['counts']['skipped']} skipped")
    return d
