"""Exact steady state (sim/steady.py, issue 66): a run whose iteration repeats exactly ends
in copies of it, and says so; its figures and every record it stores are those of the
run that simulates every iteration (`--every-iteration`), to the byte. What could change
the next iteration keeps the run whole until it has happened: a fault still to come, a
trace; what the key cannot read stops the search."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from oddl.app.experiments.results import RunStore
from oddl.app.experiments.runner import Timeline, run_experiment
from oddl.controller.base.clock import Clock
from oddl.controller.base.config import (
    ConfigError,
    Experiment,
    LoadedExperiment,
    Monitor,
    load_experiment,
)
from oddl.controller.base.config.faults import FaultSpec
from oddl.controller.base.topology import Grid
from oddl.controller.service.backend import Repeats
from oddl.controller.stage2.workloads import total_iterations
from oddl.fpga import regmap as R
from oddl.sim import backend as sim_backend
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.steady import Unkeyable, key

from tests.helpers import make_testbed

ROOT = Path(__file__).resolve().parent.parent
TABLE1 = ROOT / "experiments" / "table1-resnet50.toml"
_HOW = ("wall_s", "plan_s", "steady_state")  # how the run went, not what it found


def _figures(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _figures(v) for k, v in x.items() if k not in _HOW}
    return x


def tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of a run's store, its rows sorted (networks that ran in processes of
    their own wrote theirs in turn)."""
    con = sqlite3.connect(db)
    try:
        names = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = "
                                           "'table' ORDER BY name")]
        return {n: sorted(con.execute(f"SELECT * FROM {n}").fetchall(), key=repr)
                for n in names}
    finally:
        con.close()


def both_ways(path: LoadedExperiment | Path, tmp: Path, iterations: int | None = None,
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run ended in copies and the same run simulated in full: each one's JSON, summary
    and store."""
    ctx = path if isinstance(path, LoadedExperiment) else load_experiment(path)
    out = {}
    for every in (False, True):
        db = tmp / f"{every}.sqlite"
        store = RunStore(db)
        try:
            res = run_experiment(ctx, iterations=iterations, store=store, workers=0,
                                 every_iteration=every)
        finally:
            store.close()
        out[every] = {"json": res.to_json_obj(), "store": tables(db),
                      "summary": json.loads(json.dumps(
                          res.summary(ctx.experiment.reference)))}
    return out[False], out[True]


def assert_same(copies: dict[str, Any], every: dict[str, Any]) -> None:
    assert _figures(copies["json"]) == _figures(every["json"])
    assert _figures(copies["summary"]) == _figures(every["summary"])
    assert copies["store"].keys() == every["store"].keys()
    for t in every["store"]:  # a table at a time: a failure names it
        assert copies["store"][t] == every["store"][t], t
    assert every["summary"]["steady_state"] == {}


def test_table1_ends_in_copies_equal_to_every_iteration(tmp_path: Path) -> None:
    copies, every = both_ways(TABLE1, tmp_path, iterations=60)
    assert_same(copies, every)
    # every iteration after the first is the same: found by the first pair of probes
    assert copies["summary"]["steady_state"] == {
        "oddl": {"simulated": 4, "copies": 56, "period_ns": 233_151_187},
        "electrical": {"simulated": 4, "copies": 56, "period_ns": 233_146_965}}
    flows = copies["store"]["flows"]
    assert len(flows) == 2 * 60 * 16 and len({(f[0], f[2]) for f in flows}) == len(flows)


def test_a_fault_to_come_keeps_the_run_whole_until_it_has_begun(tmp_path: Path) -> None:
    """Table 1's transmitter n0/H tunes slowly from iteration 20 on: the iterations before
    it repeat, but are simulated; after it they repeat again, and are copied."""
    ctx = load_experiment(TABLE1)
    slow = FaultSpec.model_validate({"kind": "slow-tx", "target": "n0/H", "tune_ns": 2000,
                                     "at_iteration": 20})
    exp = ctx.experiment.model_copy(update={"iterations": 48, "faults": [slow]})
    copies, every = both_ways(LoadedExperiment(ctx.path, exp, ctx.testbed_path, ctx.testbed),
                              tmp_path)
    assert_same(copies, every)
    st = copies["summary"]["steady_state"]["oddl"]
    assert st["simulated"] > 20 and st["simulated"] + st["copies"] == 48, st
    its = {i: t1 - t0 for (net, i, t0, t1, *_r) in copies["store"]["iterations"]
           if net == "oddl"}
    assert its[21] > its[19]  # (the fault slowed them)


def _drill(faults: list[dict[str, Any]], ranks: int | None = None) -> LoadedExperiment:
    """A 2 x 2 grid whose iterations (0.2 ms of compute, about 2 ms in all) are far
    shorter than the watch's period (50 ms): a fault's evidence can wait in a register
    for many iterations before the watch reads it."""
    tb = make_testbed(2, 2).model_copy(update={"monitor": Monitor(heartbeat_ms=50,
                                                                   grace_ms=2000)})
    exp = Experiment.model_validate({
        "name": "drill", "testbed": "tb.toml", "iterations": 60,
        "workload": {"model": "resnet50", "collective": "hd", "epochs": 1,
                     "dataset_samples": 1_000_000, "batch_per_node": 64,
                     "compute_time_ms": 0.2, "ranks": ranks},
        "networks": [{"name": "oddl", "kind": "oddl"}], "faults": faults})
    return LoadedExperiment(Path("drill.toml"), exp, Path("tb.toml"), tb)


def test_a_short_fault_is_diagnosed_though_the_run_ends_in_copies(tmp_path: Path) -> None:
    """Issue 85: a transmitter slow for 2 ms from the start leaves its tuning time in the
    register the heartbeat reads at 50 ms; the iterations repeat long before, and the
    copies ran no heartbeat: the fault was never found (`--every-iteration`: at 50 ms).
    The copies wait until the watch has read what the last fault left."""
    ctx = _drill([{"kind": "slow-tx", "target": "n0-0/H", "tune_ns": 20_000, "at_ms": 0,
                   "duration_ms": 2}])
    copies, every = both_ways(ctx, tmp_path)
    assert_same(copies, every)
    [row] = copies["json"]["networks"]["oddl"]["faults"]
    assert row["kind"] == "slow-tx" and row["detected_after_ns"] == 50_001_000
    assert copies["summary"]["steady_state"]["oddl"]["copies"] > 0


def test_a_board_dead_outside_the_job_leaves_the_run_to_repeat(tmp_path: Path) -> None:
    """Issue 85: a spare board dead for good made the bus draw from its generator for
    every message (with no loss set), so no two iterations were alike and the run was
    simulated in full. The figures are the full run's, and the run ends in copies."""
    ctx = _drill([{"kind": "dead-board", "target": "n1-1", "at_ms": 0}], ranks=3)
    copies, every = both_ways(ctx, tmp_path)
    assert_same(copies, every)
    assert copies["summary"]["steady_state"]["oddl"]["copies"] > 0


def test_a_traced_run_simulates_every_iteration() -> None:
    ctx = load_experiment(TABLE1)
    res = run_experiment(ctx, iterations=12, trace=Timeline(2))
    assert all(not r.steady for r in res.networks.values())
    assert res.networks["oddl"].iterations == 12


def test_the_store_writes_copies_as_their_flows_say(tmp_path: Path) -> None:
    """The store writes copies' flows in SQL: the same rows, in the same order (by rowid),
    as `Repeats.flows_of` says and as a run that wrote each would have."""
    rows = [(7, 0, "n0", "n1", 100, 1, 1_000, 2_000), (4, 1, "n1", "n0", 50, 2, 1_500, 2_700),
            (9, 1, "n2", "n3", 80, 1, 1_900, 2_900)]
    rep = Repeats(0, 10_000, rows, [16, 16, 12])
    store = RunStore(tmp_path / "s.sqlite")
    try:
        store.add_iteration("oddl", 0, 0, 10_000, 500, 6, rows)
        for i in range(1, 6):  # the last commits them all
            store.add_iteration("oddl", i, i * 10_000, (i + 1) * 10_000, 500, 6, [],
                                commit=i == 5, repeats=rep)
    finally:
        store.close()
    con = sqlite3.connect(tmp_path / "s.sqlite")
    got = con.execute("SELECT flow, step, src, dst, bytes, hops, t_submit_ns, t_deliver_ns "
                      "FROM flows ORDER BY rowid").fetchall()
    counts = con.execute("SELECT flows FROM iterations ORDER BY iteration").fetchall()
    con.close()
    assert got == rows + [f for i in range(1, 6) for f in rep.flows_of(i)]
    assert got[3] == (7 + 16, 0, "n0", "n1", 100, 1, 11_000, 12_000)
    assert counts == [(3,)] * 6


class _Watcher:
    """The bus's watchers as a published run tells them: over a connection with its locks
    and threads, which the key must not walk into (found publishing: the baseline's
    callback led to it, and its run was simulated in full, 20 s)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.told: dict[str, list[int]] = {}  # network -> the iterations told, in order

    def announce(self, kind: str, payload: bytes) -> None:
        with self.lock:
            if kind == "iteration":
                note = json.loads(payload)
                self.told.setdefault(note["network"], []).append(note["iteration"])


def test_a_published_run_ends_in_copies_and_tells_one_in_many() -> None:
    ctx = load_experiment(TABLE1)
    w = _Watcher()
    res = run_experiment(ctx, iterations=5000, announce=w.announce)
    assert all(r.steady["copies"] == 4996 for r in res.networks.values())
    # each network: its 4 simulated, its first 256 copies, then the 4,096th iteration and
    # the last (the copies come as one run; these are the ones it tells of)
    assert w.told == {n: [*range(4 + 256), 4095, 4999] for n in res.networks}


def _world() -> tuple[Any, Clock]:
    tb = make_testbed(1, 2)
    loop = VirtualClockLoop()
    clock = Clock(loop)
    return sim_backend.build(tb, Grid.from_testbed(tb), clock), clock


def test_the_key_holds_what_decides_and_leaves_out_counts_and_labels() -> None:
    w, clock = _world()
    board = w.boards["n0-0"]

    def k() -> list[Any]:
        return key([w], [], clock.now_ns(), frozenset())
    k0 = k()
    reg = R.BY_NAME
    board.regs[reg["TXH_DONE_COUNT"].offset] += 1  # a count
    board.regs[reg["TXH_FLOW"].offset] += 16  # a label: the last flow's id
    w.fabric.tx[("n0-0", "H")].sent_bytes += 1000
    assert k() == k0
    board.regs[reg["TXH_CHANNEL"].offset] = 1  # the channel it tunes to next decides
    assert k() != k0
    board.regs[reg["TXH_CHANNEL"].offset] = 0
    assert k() == k0
    w.fabric.tx[("n0-0", "H")].channel = 1  # so does the channel it is tuned to
    assert k() != k0


def test_the_key_reads_the_fields_of_the_typed_core() -> None:
    """Compiled, the bus, the fabric and the drivers are C classes (their .pxd beside
    their .py): no instance dict to walk. Their declared fields enter the key all the
    same, less the counts; interpreted, the same."""
    from oddl.controller.base.messages import Flow

    w, clock = _world()

    def k() -> list[Any]:
        return key([w], [], clock.now_ns(), frozenset())
    k0 = k()
    w.bus.sent += 5  # a count
    w.fabric.transfers += 1
    assert k() == k0
    w.bus.latency_ns += 1  # how late every message lands decides
    assert k() != k0
    w.bus.latency_ns -= 1
    assert k() == k0
    w.fabric.guard_ns += 1  # so does the gap after a transfer
    assert k() != k0
    w.fabric.guard_ns -= 1
    w.onics["n0-0"].inflight["H"] = Flow(1, "n0-0", "n0-1", 64)  # a transfer under way
    assert k() != k0


def test_a_time_enters_the_key_as_its_distance_from_now() -> None:
    """A tune under way: its end's distance from now; a tune long over: only that it is
    over, and how long it took (the board's TUNE_NS)."""
    w, _clock = _world()
    tx = w.fabric.tx[("n0-0", "H")]
    tx.tune_from, tx.tune_until = 990, 1_010
    a = key([w], [], 1_000, frozenset())
    tx.tune_from, tx.tune_until = 1_490, 1_510
    assert key([w], [], 1_500, frozenset()) == a
    assert key([w], [], 1_501, frozenset()) != a
    tx.tune_from, tx.tune_until = 100, 110
    over = key([w], [], 1_000, frozenset())
    assert key([w], [], 9_000, frozenset()) == over
    tx.tune_from = 90  # a tune that took longer
    assert key([w], [], 9_000, frozenset()) != over


def test_what_the_key_cannot_read_stops_the_search() -> None:
    w, _clock = _world()
    w.boards["n0-0"].mystery = threading.Lock()  # state the walk cannot see into
    with pytest.raises(Unkeyable, match="lock"):
        key([w], [], 0, frozenset())
    w.boards["n0-0"].mystery = {_Watcher()}  # objects in no order of their own
    with pytest.raises(Unkeyable, match="set of objects"):
        key([w], [], 0, frozenset())
    w.boards["n0-0"].mystery = {("n0-0", 3), ("n1-0", 2)}  # values: their sorted reprs
    assert key([w], [], 0, frozenset()) == key([w], [], 0, frozenset())


@pytest.mark.realtime
def test_oddl_run_says_what_it_copied_and_every_iteration_simulates_all(
        tmp_path: Path) -> None:
    """As a user runs it: the report says what was simulated and what copied; the run
    directory's summary says it too; `--every-iteration` simulates all, and stores the
    same."""
    env = {**os.environ, "ODDL_PLOT": "0", "COLUMNS": "200"}
    outs = {}
    for flag in ("", "--every-iteration"):
        d = tmp_path / (flag or "copies")
        p = subprocess.run([sys.executable, "-m", "oddl.app", "run", str(TABLE1), "--iterations",
                            "30", "--out", str(d), *([flag] if flag else [])],
                           capture_output=True, text=True, timeout=300, env=env,
                           cwd=tmp_path, check=False)
        assert p.returncode == 0, p.stderr
        outs[flag] = (p.stdout, json.loads((d / "summary.json").read_text()),
                      tables(d / "results.sqlite"))
    said, summary, store = outs[""]
    assert "oddl: 4 iterations simulated, then 26 copies of the last" in said
    assert summary["steady_state"]["oddl"]["copies"] == 26
    said_all, summary_all, store_all = outs["--every-iteration"]
    assert "copies" not in said_all and summary_all["steady_state"] == {}
    assert store == store_all


def _shipped() -> list[Path]:
    """Every shipped experiment of one workload with more than the four iterations a
    repeat needs before its copies can begin."""
    out = []
    for p in sorted((ROOT / "experiments").glob("*.toml")):
        try:
            ctx = load_experiment(p)
        except ConfigError:  # a sweep, or a job for an arbiter: not a run
            continue
        if ctx.jobs:
            continue
        w = ctx.workload
        n = ctx.experiment.iterations or total_iterations(w, w.ranks or ctx.testbed.n_nodes)
        if n > 4:
            out.append(p)
    return out


@pytest.mark.every_iteration
@pytest.mark.parametrize("path", _shipped(), ids=lambda p: p.stem)
def test_every_shipped_run_that_repeats_ends_in_copies_equal_to_the_full_run(
        path: Path, tmp_path: Path) -> None:
    copies, every = both_ways(path, tmp_path)
    assert_same(copies, every)


@pytest.mark.every_iteration
def test_table1_on_the_64_node_grid_ends_in_copies_equal_to_the_full_run(
        tmp_path: Path) -> None:
    """Relays, two dimensions, 64 ranks' halving-doubling: 40 iterations both ways."""
    ctx = load_experiment(TABLE1, ROOT / "hw_configs" / "grid-64.toml")
    copies, every = both_ways(ctx, tmp_path, iterations=40)
    assert_same(copies, every)
    assert copies["summary"]["steady_state"]["oddl"]["copies"] == 36
