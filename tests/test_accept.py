"""`oddl accept` against `oddl emulate`: passes a healthy testbed, and each injected fault
fails exactly the check that should catch it, with a message naming the device."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from oddl.controller.service.lock import TestbedBusy, TestbedLock

from tests.helpers import emulator

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock

PROTO = "hw_configs/prototype-4node.toml"


def relaxed(root: Path, tmp_path: Path, name: str = PROTO, p99_ms: float = 10_000.0) -> str:
    """The testbed with its control round-trip spec set to p99_ms: the suite's other checks
    are deterministic on the emulator, the round trip is wall-clock time on a shared
    machine, so tests hold it to a spec it cannot miss (or cannot meet) by chance."""
    text = re.sub(r"(?m)^control_rtt_p99_ms = .*$", f"control_rtt_p99_ms = {p99_ms}",
                  (root / name).read_text())
    out = tmp_path / f"rtt-{p99_ms:g}-{Path(name).name}"
    out.write_text(text)
    return str(out)


def accept(root: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oddl.app", "accept", *args],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def summary(report: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((report / "summary.json").read_text())


def outcomes(report: Path, kind: str) -> dict[str, str]:
    return {c["check"]: c["message"] for c in summary(report)["checks"] if c["outcome"] == kind}


@pytest.fixture(scope="module")
def proto(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One `oddl emulate` of the (relaxed) prototype, serving the checks that need no
    fault of their own, as a lab's emulator serves acceptance after acceptance."""
    d = tmp_path_factory.mktemp("accept-emu")
    with emulator(root, Path(relaxed(root, d)), d / "emu.toml"):
        yield d / "emu.toml"


def test_healthy_emulated_prototype_passes(root: Path, tmp_path: Path, proto: Path) -> None:
    r = accept(root, str(proto), "--report", str(tmp_path / "r"))
    tmp_path = tmp_path / "r"
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(tmp_path)
    assert s["verdict"] == "PASS" and s["backend"] == "emu"
    # 4 boards x (reachable, identity, registers, count-action), 4 transmitters, 8 routes,
    # 4 links, 1 control round trip; no QICK board on this testbed: both Lightning checks skip
    assert s["counts"] == {"passed": 33, "failed": 0, "skipped": 2}
    figs = {c["check"]: {f["name"]: f for f in c["figures"]} for c in s["checks"]}
    tune = figs["test_tuning_time[n0/H]"]["worst tuning time"]
    assert tune["value"] == 11 and "10.5" in tune["spec"]  # 10.5 ns at 1 ns resolution
    assert figs["test_wss_route[wss-row0:in2/ch1]"]["received at"]["value"] == "n0"
    assert figs["test_link_loopback[n1/H]"]["CRC errors"]["value"] == 0
    assert figs["test_control_rtt"]["REQUEST->GRANT p99"]["value"] > 0
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert len(cases) == 35 and not junit.findall(".//failure")
    md = (tmp_path / "summary.md").read_text()
    assert "**PASS**" in md and "worst tuning time = 11 ns" in md


# each fault's check, the message naming the device; the faults on distinct devices, so
# that one acceptance of a testbed with all of them fails exactly their checks
FAULTS = [
    ("slow-tx:n1/H:25", "test_tuning_time[n1/H]",
     "n1/H tunes slower than 10.5 ns: 1565.941 -> 1546.5377 nm: 25 ns"),
    ("wss-route:wss-row0:0/1:3", "test_wss_route[wss-row0:in0/ch1]",
     "wss-row0 in 0 (n0) on 1546.5377 nm: expected at n2, light landed at n3"),
    ("corrupt-link:n3/H", "test_link_loopback[n3/H]",
     "n3/H loopback: 1000000 of 1000000 B, 1 CRC errors"),
]


def test_each_fault_fails_exactly_its_check(root: Path, tmp_path: Path) -> None:
    args = [a for fault, _c, _m in FAULTS for a in ("--fault", fault)]
    r = accept(root, relaxed(root, tmp_path), *args, "--report", str(tmp_path / "r"))
    tmp_path = tmp_path / "r"
    assert r.returncode == 1, r.stdout + r.stderr
    failed = outcomes(tmp_path, "failed")
    assert sorted(failed) == sorted(check for _f, check, _m in FAULTS)
    for _fault, check, message in FAULTS:
        assert failed[check].startswith(message), failed[check]
        assert f"FAIL {check}: {message}" in r.stdout
    assert summary(tmp_path)["verdict"] == "FAIL"


def test_a_dead_board_fails_its_check_and_skips_what_needs_it(root: Path,
                                                              tmp_path: Path) -> None:
    r = accept(root, relaxed(root, tmp_path), "--fault", "dead-board:n2", "--report",
               str(tmp_path / "r"))
    tmp_path = tmp_path / "r"
    assert r.returncode == 1, r.stdout + r.stderr
    failed = outcomes(tmp_path, "failed")
    assert list(failed) == ["test_board_reachable[n2]"]
    assert failed["test_board_reachable[n2]"].startswith("board n2 (grpc://127.0.0.1:")
    skipped = outcomes(tmp_path, "skipped")  # what needs n2 is skipped, naming the cause
    for check in ("test_lightning_accuracy", "test_lightning_inference"):
        assert skipped.pop(check) == "the testbed config has no [qick] board"
    assert "test_identity[n2]" in skipped and "test_link_loopback[n2/H]" in skipped
    assert all("n2, which is unreachable" in m for m in skipped.values())
    assert "test_identity[n1]" not in skipped


def test_only_selects_checks(root: Path, tmp_path: Path, proto: Path) -> None:
    r = accept(root, str(proto), "--only", "tuning", "--only", "identity", "--report",
               str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted({c["check"].split("[")[0] for c in summary(tmp_path)["checks"]}) == [
        "test_identity", "test_tuning_time"]
    r = accept(root, str(proto), "--only", "warp-drive", "--report",
               str(tmp_path / "refused"))
    assert r.returncode == 2 and "unknown check(s) warp-drive" in r.stderr
    assert not (tmp_path / "refused").exists()  # a refused run leaves nothing behind


def test_other_pytest_plugins_installed_change_no_verdict(root: Path, tmp_path: Path,
                                                          proto: Path) -> None:
    """`oddl accept` runs its suite with its own plugin only: a pytest plugin installed
    beside oddl (here one that deselects every test, an entry point on the path) took part,
    and the acceptance ran no check (exit 2, "the suite did not run")."""
    site = tmp_path / "site"
    (site / "deselect_all-0.1.dist-info").mkdir(parents=True)
    (site / "deselect_all-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: deselect-all\nVersion: 0.1\n")
    (site / "deselect_all-0.1.dist-info" / "entry_points.txt").write_text(
        "[pytest11]\ndeselect_all = deselect_all\n")
    (site / "deselect_all.py").write_text(
        "def pytest_collection_modifyitems(items):\n    items.clear()\n")
    r = accept(root, str(proto), "--only", "identity", "--report", str(tmp_path / "r"),
               env={"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary(tmp_path / "r")["counts"] == {"passed": 4, "failed": 0, "skipped": 0}


def test_absent_board_skips_and_unanswering_board_fails(root: Path, tmp_path: Path) -> None:
    """No address in the config: skipped with the reason. An address that does not answer:
    failed (a board that vanished from the lab must not pass by omission)."""
    text = (root / PROTO).read_text()
    text = text.replace('board = "onic2"\n', "").replace('board = "onic3"\n', "")  # absent
    text = text.replace('board = "onic1"', 'board = "grpc://127.0.0.1:9"')  # nothing there
    cfg = tmp_path / "tb.toml"
    cfg.write_text(text.replace('backend = "sim"', 'backend = "hw"'))
    r = accept(root, str(cfg), "--only", "reachable", "--report", str(tmp_path / "r"),
               env={"ODDL_LOCK_DIR": str(tmp_path / "locks")})
    assert r.returncode == 1, r.stdout + r.stderr
    failed = outcomes(tmp_path / "r", "failed")
    assert sorted(failed) == ["test_board_reachable[n0]", "test_board_reachable[n1]"]
    # n0 still says 'onic0', a name a lab must replace by an address
    assert failed["test_board_reachable[n0]"] == (
        "board n0 (onic0): board address 'onic0' is neither grpc://HOST:PORT, "
        "serial:PORT[?baud=B] nor 'local'")
    assert failed["test_board_reachable[n1]"] == (
        "board n1 (grpc://127.0.0.1:9): Failed to connect to remote device")
    assert outcomes(tmp_path / "r", "skipped") == {
        f"test_board_reachable[{n}]": f"{n}: no board address in the testbed config"
        for n in ("n2", "n3")}


def test_second_run_on_a_held_testbed_is_refused_naming_the_holder(root: Path,
                                                                    tmp_path: Path) -> None:
    env = {"ODDL_LOCK_DIR": str(tmp_path)}
    holder = TestbedLock("prototype-4node", purpose="oddl run table1 (by the test)",
                         directory=tmp_path).acquire()
    try:
        r = accept(root, PROTO, "--backend", "hw", "--wait", "0.3", "--report",
                   str(tmp_path / "refused"), env=env)
        assert r.returncode == 3
        assert not (tmp_path / "refused").exists()
        assert "testbed 'prototype-4node' is in use by oddl run table1 (by the test) " \
               f"(pid {os.getpid()}" in r.stderr
        assert "after waiting" in r.stderr
    finally:
        holder.release()


def test_lock_is_released_when_its_holder_dies(tmp_path: Path) -> None:
    code = ("import sys,time; from oddl.controller.service.lock import TestbedLock; "
            f"TestbedLock('tb', 'holder', __import__('pathlib').Path({str(tmp_path)!r}))"
            ".acquire(); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(TestbedBusy, match=rf"in use by holder \(pid {p.pid}"):
            TestbedLock("tb", directory=tmp_path).acquire()
    finally:
        p.kill()
        p.wait()
    TestbedLock("tb", directory=tmp_path).acquire().release()  # no stale lock to clean


def test_lock_waits_for_the_holder(tmp_path: Path) -> None:
    a = TestbedLock("tb", "first", tmp_path).acquire()
    b = TestbedLock("tb", "second", tmp_path)
    with pytest.raises(TestbedBusy, match="in use by first"):
        b.acquire()
    a.release()
    b.acquire(wait_s=1.0)
    assert b.holder()["command"] == "second"
    b.release()


def test_a_control_bus_slower_than_its_spec_fails_the_round_trip_check(
        root: Path, tmp_path: Path, proto: Path) -> None:
    # no broker answers in a microsecond: the check must fail, naming figure and spec (the
    # emulator's config, its acceptance spec tightened)
    strict = tmp_path / "emu.toml"
    strict.write_text(re.sub(r"(?m)^control_rtt_p99_ms = .*$", "control_rtt_p99_ms = 0.001",
                             proto.read_text()))
    r = accept(root, str(strict), "--only", "control-rtt", "--report", str(tmp_path / "r"))
    assert r.returncode == 1
    msg = outcomes(tmp_path / "r", "failed")["test_control_rtt"]
    assert re.match(r"control round trip p99 \d+\.\d{3} ms > 0\.001 ms \(broker "
                    r"mqtt://127\.0\.0\.1:\d+; this host's loop lag p99 \d+\.\d ms\)",
                    msg), msg


def test_an_acceptance_that_checked_nothing_does_not_pass(root: Path, tmp_path: Path,
                                                         proto: Path) -> None:
    """Reproducer: every check skipped (here Lightning's, on a testbed with no QICK board;
    in CI a round trip the loaded host was blamed for) and `oddl accept` exited 0, the
    code docs/acceptance.md gives "every check passed", its verdict NOTHING CHECKED. An
    acceptance script took that for a pass. It exits 4, saying each check's reason."""
    r = accept(root, str(proto), "--only", "lightning", "--report", str(tmp_path / "r"))
    assert r.returncode == 4, r.stdout + r.stderr
    assert summary(tmp_path / "r")["verdict"] == "NOTHING CHECKED"
    assert "NOTHING CHECKED: 0 passed, 0 failed, 1 skipped" in r.stdout
    assert re.search(r"(?m)^SKIP test_lightning\w*: .*no \[qick\] board", r.stdout), r.stdout


def test_a_round_trip_the_hosts_own_lag_explains_names_the_host() -> None:
    """Issue 83: on a loaded laptop the control round trip failed (p99 7.2 ms > 5 ms) and
    nothing said the host was the cause. Judged against this host's loop lag measured
    beside it: what that lag accounts for is the host's, said so; the rest is a failure."""
    from oddl.acceptance.plugin import Spread, host_explains

    typical = Spread(p50=1.5, p99=7.2)  # (ms; its median well within the limit)
    assert host_explains(typical, Spread(0.1, 6.1), 5.0)  # the issue's: 1.1 ms left
    assert not host_explains(typical, Spread(0.1, 1.0), 5.0)  # 6.2 ms left: not the host
    assert not host_explains(Spread(1.0, 4.0), Spread(5.0, 10.0), 5.0)  # nothing to explain
    assert not host_explains(typical, Spread(0.0, 0.0), 5.0)  # an on-time host: nothing
    # CI, beside the suite: a spec of 1 us against a broker's 0.788 ms median round trip
    # (p99 1.084 ms) was skipped as the host's (its loop lag p99 1.863 ms), and `oddl
    # accept` passed. The tail is the host's; a median 788 times the limit is not
    assert not host_explains(Spread(0.788, 1.084), Spread(0.2, 1.863), 0.001)
    # a host so late that its median lateness covers the median round trip: the host's
    assert host_explains(Spread(0.788, 1.084), Spread(0.8, 1.863), 0.001)
