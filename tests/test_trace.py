"""`oddl run --trace`: the timeline agrees with the run's own flow records, message counts
and count-action schedule; the same rows travel from a node program to the controller."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import pytest
from oddl.app.experiments.results import RunStore, read_store
from oddl.app.experiments.runner import Timeline, run_experiment
from oddl.controller.base.config import load_experiment
from oddl.controller.stage2.job import JobEvent
from oddl.controller.stage2.trace import MAX_ROWS, TraceRow

from tests.helpers import check_chrome

TABLE1 = "experiments/table1-resnet50.toml"
K = 2  # iterations traced, of 3 run


@pytest.fixture(scope="module")
def traced(root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    d = tmp_path_factory.mktemp("trace")
    store = RunStore(d / "results.sqlite")
    tl = Timeline(K)
    res = run_experiment(load_experiment(root / TABLE1), "sim", store, 3, trace=tl)
    store.close()
    return res, tl, read_store(d / "results.sqlite"), d / "results.sqlite"


def test_every_flow_record_has_its_slices(traced: tuple[Any, ...]) -> None:
    _, tl, data, db_path = traced

    db = sqlite3.connect(db_path)
    flows = db.execute("SELECT flow, src, dst, hops, t_submit_ns, t_deliver_ns FROM flows "
                       "WHERE network = 'oddl' AND iteration < ?", (K,)).fetchall()
    rows = tl.chrome.rows["oddl"]
    sending = [r for r in rows if r.kind == "state" and r.what == "sending"]
    # one sending slice per hop of every flow of the traced iterations, and no others
    assert Counter((r.flow, r.hop) for r in sending) == Counter(
        (f, h) for f, *_, hops, _, _ in flows for h in range(hops))
    for flow, src, _dst, hops, t_submit, t_deliver in flows:
        mine = [r for r in rows if r.kind == "state" and r.flow == flow]
        first = min(mine, key=lambda r: r.t0)
        assert (first.node, first.what, first.hop) == (src, "requesting", 0)
        assert first.t0 >= t_submit
        last = max((r for r in mine if r.what == "sending"), key=lambda r: r.t1)
        assert last.hop == hops - 1 and last.t1 <= t_deliver
        # a port does one thing at a time: its slices do not overlap
    by_port: dict[tuple[str, str], list[TraceRow]] = {}
    for r in rows:
        if r.kind == "state":
            by_port.setdefault((r.node, r.port), []).append(r)
    for slices in by_port.values():
        slices.sort(key=lambda r: r.t0)
        assert all(a.t1 <= b.t0 for a, b in pairwise(slices))
    # nothing of the untraced iteration
    its = data["oddl"]["iterations"]
    assert max(r.t0 for r in rows) < its[K][2]


def test_messages_and_firings_match_the_run(traced: tuple[Any, ...]) -> None:
    res, tl, data, _ = traced
    rows = tl.chrome.rows["oddl"]
    its = data["oddl"]["iterations"]
    sent = sum(r[6] for r in its[:K])  # control messages of the traced iterations
    assert sum(r.kind == "send" for r in rows) == sent
    assert sum(r.kind == "recv" for r in rows) == sent  # nothing lost in a clean run
    assert res.networks["oddl"].stats["step_sync"] == "o-nic count-action"
    # HD on 4 ranks: each rank's count-action engine fires once per step (4 steps)
    assert sum(r.kind == "fire" for r in rows) == K * 4 * 4
    events = tl.chrome.events()
    check_chrome(events)
    assert sum(e["ph"] == "f" for e in events) == sent
    iters = [e for e in events if e["ph"] == "X" and e["name"].startswith("iteration")]
    assert len(iters) == 2 * K  # oddl and electrical
    # a flow-level model has no control units: its timeline is its ranks' phases only
    assert {r.kind for r in tl.chrome.rows["electrical"]} == {"phase"}


def test_trace_cli_writes_a_file(root: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from oddl.app.cli import main

    f = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["run", str(root / TABLE1), "--iterations", "2", "--out",
                                  str(tmp_path / "run"), "--trace", str(f),
                                  "--trace-iterations", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(f.read_text())
    check_chrome(doc["traceEvents"])


def test_trace_rows_on_the_wire_are_bounded() -> None:
    row = TraceRow("state", "n0", "H", "sending", 10, 20, 7, 0, "n1")
    ev = JobEvent(5, "j", "iteration", "n0", iteration=0, trace=[row])
    back = msgspec.json.decode(msgspec.json.encode(ev), type=JobEvent)
    assert back.trace == [row]
    assert msgspec.json.encode(row) == b'["state","n0","H","sending",10,20,7,0,"n1"]'
    big = msgspec.json.encode({"v": 5, "job": "j", "kind": "iteration", "node": "n0",
                               "trace": [["fire", "n0", "", "slot 0", 1]] * (MAX_ROWS + 1)})
    with pytest.raises(msgspec.ValidationError, match="trace"):
        msgspec.json.decode(big, type=JobEvent)
    with pytest.raises(msgspec.ValidationError):  # a node name that is no topic level
        msgspec.json.decode(b'["fire","n/0","","slot 0",1]', type=TraceRow)


@pytest.mark.parametrize("name", ["n/0", "n0 ", "n+", "n#", "x" * 65])
def test_names_on_the_wire_are_whole_topic_levels(name: str) -> None:
    """Reproducer: msgspec's `pattern` searches, so the unanchored name rule let "n/0"
    through as "n" in heartbeats, job events and trace rows alike."""
    from oddl.controller.service.health import Heartbeat

    for payload, t in ((["fire", name, "", "slot 0", 1], TraceRow),
                       ({"v": 5, "job": "j", "kind": "ready", "node": name}, JobEvent),
                       ({"v": 1, "node": name, "seq": 0}, Heartbeat)):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(msgspec.json.encode(payload), type=t)
