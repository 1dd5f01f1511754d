"""bench/soak.py on a loaded machine (issue 83): `--busy N` keeps N processes spinning, and
a failure's report says whether it names the host as the cause, as a verdict a late answer
can give must."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from bench import soak

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" time="1.0"/>
<testcase classname="tests.test_a" name="test_late" time="1.0"><failure message="dead-board
n1 (silent for 700.0 ms, beyond 3 periods and the 628 ms a loaded host is given (its host's
loop ran 314 ms late, as n0 said; this controller's 2 ms: the host may be the cause))"/>
</testcase>
<testcase classname="tests.test_a" name="test_bad" time="1.0"><failure message="register
0x40 read 0x0, wanted 0x1"/></testcase></testsuite></testsuites>"""


def test_a_failure_that_names_the_host_is_told_apart(tmp_path: Path) -> None:
    (tmp_path / "r.xml").write_text(REPORT)
    tests, bad = soak.failures(tmp_path / "r.xml")
    assert tests == 3 and sorted(bad) == ["tests.test_a::test_bad", "tests.test_a::test_late"]
    assert bad["tests.test_a::test_late"].startswith("[names the host] dead-board")
    assert bad["tests.test_a::test_bad"].startswith("register")


def test_busy_keeps_n_processes_spinning_and_stops_them() -> None:
    me = psutil.Process()
    with soak.busy(2):
        # (spawn's resource tracker is a child too)
        kids = [k for k in me.children() if "spawn_main" in " ".join(k.cmdline())]
        assert len(kids) == 2
        deadline = time.monotonic() + 30
        while sum(k.cpu_times().user for k in kids) < 0.2:  # they spin
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
