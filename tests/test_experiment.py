"""The Table 1 experiment end to end: model output, JSON contract, run dir, crash safety."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.app.experiments.results import read_store
from oddl.app.experiments.runner import run_experiment
from oddl.controller.base.config import load_experiment

TABLE1 = "experiments/table1-resnet50.toml"


def test_table1_regression(root: Path) -> None:
    res = run_experiment(load_experiment(root / TABLE1), iterations=8, checker_mode="raise")
    el, od = res.networks["electrical"], res.networks["oddl"]
    assert res.total_iterations == 25_040
    # calibrated: electrical reproduces the paper's 97.3 min
    assert abs(el.training_time_s / 60 - 97.3) < 1e-3
    # ODDL's figure comes out of the model: slower than ideal, within 1 %
    assert 1.000 < res.ratio < 1.010
    assert od.training_time_s > el.training_time_s
    # HD on 4 nodes: 4 steps x 4 flows per iteration; 3 control messages per flow
    assert od.flows == el.flows == 8 * 16
    assert od.control_messages == 3 * od.flows
    assert res.invariant_violations == 0
    # every step of every rank was completed by the O-NIC's count-action engine
    assert od.stats["step_sync"] == "o-nic count-action"
    assert od.stats["count_action_fires"] == 4 * 4 * 8
    # the all-reduce: 1.5 x 102.24 MB per node at 100 Gb/s ~ 12.27 ms, plus overheads
    comm = od.iteration_time_s - res.compute_ns / 1e9
    assert 0.01227 < comm < 0.0124


def test_publishing_a_run_with_no_broker_running_says_how(root: Path, tmp_path: Path
                                                          ) -> None:
    """Found trying `oddl run --publish` as a user: a sim testbed's broker is the embedded
    one, which runs only inside `oddl emulate`; the run failed with "the embedded broker's
    port is known only once it runs". It now names the file and field, and what to do."""
    r = CliRunner().invoke(main, ["run", str(root / TABLE1), "--iterations", "3", "--publish",
                                  "--out", str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    assert "prototype-4node.toml: broker: --publish:" in r.output
    assert "oddl emulate TESTBED --out EMU.toml" in r.output
    assert "Traceback" not in r.output


def test_run_json_is_one_object_and_run_dir_complete(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", str(root / TABLE1), "--iterations", "5", "--json",
                                  "--out", str(out), "--plot"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)  # exactly one JSON object, nothing else on stdout
    assert set(obj) == {"experiment", "backend", "networks", "ratio", "invariant_violations",
                        "wall_s"}
    assert set(obj["networks"]) == {"oddl", "electrical"}
    assert set(obj["networks"]["oddl"]) == {"training_time_s", "iteration_time_s",
                                            "iterations", "flows", "control_messages",
                                            "invariant_violations", "disturbance",
                                            "disturbed", "faults", "fault_time_s"}
    assert obj["networks"]["oddl"]["faults"] == []
    assert obj["networks"]["oddl"]["disturbed"] is False  # a clean run says so
    assert obj["invariant_violations"] == 0 and 1.0 < obj["ratio"] < 1.01
    man = json.loads((out / "manifest.json").read_text())
    assert {"git_revision", "packages", "configs", "seed", "argv"} <= set(man)
    assert "prototype-4node" in man["configs"]["testbed"]["text"]
    data = read_store(out / "results.sqlite")
    assert [r[0] for r in data["oddl"]["iterations"]] == list(range(5))
    assert data["oddl"]["flow_rows"] == 5 * 16
    # what the plot reads: the iterations, without a scan of every flow row to count them
    lean = read_store(out / "results.sqlite", flow_rows=False)
    assert lean["oddl"]["flow_rows"] is None
    assert {n: d | {"flow_rows": 0} for n, d in lean.items()} == \
        {n: d | {"flow_rows": 0} for n, d in data.items()}
    assert (out / "plot.png").stat().st_size > 10_000
    # the plot read the finished store as immutable: no empty -wal and -shm left beside it
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("results")) == [
        "results.sqlite"]


def test_a_disturbed_run_says_so(root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 13): junk and loss gave exit 0, 0 violations and +88% iteration
    time with nothing said. A run whose control plane was disturbed beyond the experiment's
    threshold is flagged, with its counters, in the JSON, the table and the run store."""
    exp = tmp_path / "lossy.toml"
    exp.write_text((root / TABLE1).read_text().replace(
        'testbed = "../hw_configs/prototype-4node.toml"',
        f'testbed = "{root / "hw_configs" / "prototype-4node.toml"}"')
        + "\n[[faults]]\nkind = \"control-loss\"\ntarget = \"bus\"\n"
          "drop_probability = 0.05\n")
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", str(exp), "--iterations", "20", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "YES: dropped" in r.stdout and "the run was disturbed" in r.stderr
    stored = read_store(out / "results.sqlite")["oddl"]
    assert stored["disturbed"] is True
    assert stored["disturbance"]["dropped"] > 0 and stored["disturbance"]["retries"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["networks"]["oddl"]["disturbed"] is True
    assert summary["networks"]["electrical"]["disturbed"] is False  # no control plane
    # the experiment decides what it tolerates
    lenient = tmp_path / "lenient.toml"
    lenient.write_text("disturbance_threshold = 1.0\n" + exp.read_text())
    r = CliRunner().invoke(main, ["run", str(lenient), "--iterations", "20", "--json",
                                  "--out", str(tmp_path / "run2")])
    assert json.loads(r.stdout)["networks"]["oddl"]["disturbed"] is False


def test_run_into_a_taken_run_dir_refuses_and_keeps_the_old_run(root: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", str(root / TABLE1), "--iterations", "3", "--out", str(out), "--no-plot"]
    assert CliRunner().invoke(main, args).exit_code == 0
    before = (out / "results.sqlite").read_bytes()
    r = CliRunner().invoke(main, [*args[:3], "5", *args[4:]])
    assert r.exit_code == 2
    assert f"{out} already holds a run" in r.output  # not an sqlite traceback
    assert (out / "results.sqlite").read_bytes() == before
    assert not (out / "plot.png").exists()  # --no-plot
    assert [i for i, *_ in read_store(out / "results.sqlite")["oddl"]["iterations"]] == [0, 1, 2]


def test_table_output(root: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["run", str(root / TABLE1), "--iterations", "3", "--out",
                                  str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert "ratio to electrical" in r.output and "97.30 min" in r.output
    assert "invariant violations: 0" in r.output


@pytest.mark.realtime
def test_killed_run_keeps_completed_iterations(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "oddl.app", "run", str(root / TABLE1),
                             "--out", str(out), "--json"], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = out / "results.sqlite"
    deadline = time.monotonic() + 120
    n = 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                    n = c.execute("SELECT COUNT(*) FROM iterations WHERE network = 'oddl'"
                                  ).fetchone()[0]
                    c.close()
                except sqlite3.OperationalError:
                    n = 0
            if n >= 200:
                break
            time.sleep(0.05)  # polling interval, not a timing assumption
        assert proc.poll() is None, "run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert n >= 200
    data = read_store(db)
    its = data["oddl"]["iterations"]
    assert len(its) >= n
    assert [r[0] for r in its] == list(range(len(its)))  # contiguous, none half-written
    assert data["oddl"]["flow_rows"] == 16 * len(its)
    assert all(r[2] > r[1] for r in its)


def test_a_reader_of_the_store_does_not_break_the_run(root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 43): results.sqlite held open by a reader (sqlite3, pandas) made
    the run fail at its end with "database is locked", exit 1 and no summary. Here a reader
    opens it at the first iteration and holds a read transaction to the end."""
    from oddl.app import api

    out = tmp_path / "run"
    readers: list[sqlite3.Connection] = []

    def progress(network: str, done: int, total: int) -> None:
        if not readers:
            c = sqlite3.connect(f"file:{out / 'results.sqlite'}?mode=ro", uri=True)
            c.execute("BEGIN")
            c.execute("SELECT COUNT(*) FROM iterations").fetchone()  # a snapshot, held
            readers.append(c)

    res = api.run(load_experiment(root / TABLE1), iterations=30, out=out, progress=progress,
                  say=lambda _line: None, workers=0)
    assert readers and res.invariant_violations == 0
    assert json.loads((out / "summary.json").read_text())["networks"]["oddl"]["iterations"] \
        == 30
    readers[0].rollback()  # the reader moves on and sees every iteration
    n = readers[0].execute("SELECT COUNT(*) FROM iterations").fetchone()[0]
    readers[0].close()
    assert n == 60  # both networks, 30 each
    assert len(read_store(out / "results.sqlite")["oddl"]["iterations"]) == 30


def test_bad_experiment_reference_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "e.toml"
    p.write_text('name = "x"\ntestbed = "missing.toml"\n[workload]\nmodel = "resnet50"\n'
                 'collective = "hd"\nepochs = 1\ndataset_samples = 10\nbatch_per_node = 1\n'
                 'compute_time_ms = 1\n[[networks]]\nname = "o"\nkind = "oddl"\n')
    r = CliRunner().invoke(main, ["run", str(p)])
    assert r.exit_code == 2
    assert f"{p}: testbed: {tmp_path / 'missing.toml'}: file not found" in r.output


@pytest.mark.parametrize("strategy", ["matched", "cyclic"])
def test_grid_hd_iteration_on_a_small_grid(root: Path, tmp_path: Path, strategy: str) -> None:
    tb = tmp_path / "g.toml"
    tb.write_text((root / "hw_configs" / "grid-1024.toml").read_text()
                  .replace("rows = 32", "rows = 4").replace("cols = 32", "cols = 8")
                  .replace('name = "grid-1024"', 'name = "g32"'))
    exp = tmp_path / "e.toml"
    exp.write_text(f'name = "g"\ntestbed = "{tb}"\n[workload]\nmodel = "resnet50"\n'
                   'collective = "hd"\nepochs = 1\ndataset_samples = 1000\nbatch_per_node = 8\n'
                   f'compute_time_ms = 1\n[[networks]]\nname = "oddl"\nkind = "oddl"\n'
                   f'strategy = "{strategy}"\n[[networks]]\nname = "el"\nkind = "electrical"\n')
    res = run_experiment(load_experiment(exp), iterations=2, checker_mode="raise")
    assert res.invariant_violations == 0
    assert res.networks["oddl"].flows == 2 * 32 * 10
    assert 1.0 < res.ratio < 1.01


def test_schedule_longer_than_the_engine_syncs_on_the_host(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    tb = tmp_path / "g.toml"
    tb.write_text((root / "hw_configs" / "grid-1024.toml").read_text()
                  .replace("rows = 32", "rows = 3").replace("cols = 32", "cols = 4"))
    exp = tmp_path / "e.toml"
    exp.write_text(f'name = "r"\ntestbed = "{tb}"\n[workload]\nmodel = "resnet50"\n'
                   'collective = "ring"\nepochs = 1\ndataset_samples = 100\nbatch_per_node = 1\n'
                   'compute_time_ms = 1\n[[networks]]\nname = "oddl"\nkind = "oddl"\n'
                   'strategy = "cyclic"\n')
    res = run_experiment(load_experiment(exp), iterations=1, checker_mode="raise")
    od = res.networks["oddl"]
    assert od.stats["step_sync"] == "host"  # 22 ring steps > 16 count-action modules
    assert od.stats["count_action_fires"] == 0
    assert res.invariant_violations == 0


def test_a_baseline_that_fails_in_its_worker_process_fails_the_run_by_name(root: Path) -> None:
    """The baselines run in processes of their own (`workers`): one that fails there ends
    the run with its name and reason, not a hang or a bare traceback from another process."""
    from oddl.app.experiments.runner import RunFailed, _Aside, _lone_job

    ctx = load_experiment(root / TABLE1)
    spec = next(s for s in ctx.experiment.networks if s.kind == "electrical")
    bad = [dataclasses.replace(_lone_job(ctx, 1, 0), collective="no-such-collective")]
    seen: list[tuple[str, int, int]] = []
    aside = _Aside(ctx, [spec], bad, "t", "raise", 0, 1, None,
                   lambda *a: seen.append(a), 1, 1)
    try:
        with pytest.raises(RunFailed, match=r"network electrical: \w+Error"):
            aside.results()
    finally:
        aside.close()
    assert seen == []  # it never completed an iteration


def test_a_process_done_with_its_own_networks_takes_the_next_model_network(root: Path
                                                                           ) -> None:
    """Issue 46 (parallel where it keeps the figures): the parent runs the ODDL networks
    and the workers the model ones; once the parent has run its own it only waits, so it
    grows the pool by one (`grow`). With one worker and two model networks, the second
    starts while the first still runs, instead of after it: a run of model networks
    alone (cassini-fattree) uses both cores of 2, and multijob-1024's electrical network
    starts when the ODDL one ends."""
    from oddl.app.experiments.runner import _Aside, _lone_job

    ctx = load_experiment(root / TABLE1)
    el = next(s for s in ctx.experiment.networks if s.kind == "electrical")
    specs = [el, el.model_copy(update={"name": "electrical-2"})]
    aside = _Aside(ctx, specs, [_lone_job(ctx, 3, 0)], "t", "raise", 0, 3, None, None, 1, 3)
    try:
        assert list(aside.running) == ["electrical"]  # one worker: the second waits
        aside.grow()
        out = aside.results()
    finally:
        aside.close()
    assert set(out) == {"electrical", "electrical-2"}
    assert out["electrical"][0].training_time_s == out["electrical-2"][0].training_time_s
    assert aside.started["electrical-2"] < aside.ended["electrical"]


def test_model_networks_go_to_workers_by_their_cost_the_longest_first(root: Path) -> None:
    """cassini-fattree simulates 15,200 flows, under the 100,000 from which a run used to
    start workers, so its nine networks ran one after another in one process although six
    step a congestion law for minutes each. Workers are now decided on the estimated
    seconds (a law costs its ticks), and take the longest first."""
    from oddl.app.experiments.runner import PARALLEL_FROM_S, _flows, model_networks
    from oddl.controller.service.jobs import JobRequest

    ctx = load_experiment(root / "experiments" / "cassini-fattree.toml")
    reqs = [JobRequest.of(e) for e in ctx.jobs]
    flows = _flows(ctx, reqs)
    assert flows < 100_000
    models = model_networks(ctx, reqs, flows)
    assert sum(c for _s, c in models) >= PARALLEL_FROM_S
    laws = [s.name for s, _c in models if s.sharing in ("tcp", "dcqcn", "mltcp-tcp",
                                                        "mltcp-dcqcn")]
    assert [s.name for s, _c in models][:len(laws)] == laws and len(laws) == 6
    assert [c for _s, c in models] == sorted((c for _s, c in models), reverse=True)


def test_a_run_tunes_the_collector_and_gives_it_back(root: Path) -> None:
    """During a run the young generation is larger, the older ones are collected less
    often, and what was set up is frozen out of the collector's passes
    (docs/performance.md); after it, a long-lived process (the arbiter,
    the emulator) has its collector as it was, nothing left frozen to leak."""
    import gc

    from oddl.app.collector import OLDER, YOUNG
    from oddl.app.experiments.runner import lone_network

    before = gc.get_threshold()
    with lone_network(load_experiment(root / TABLE1), "oddl", 1, 0) as net:
        assert gc.get_threshold() == (YOUNG, OLDER, OLDER)
        assert gc.get_freeze_count() > 0  # the boards, the fabric, the plan's inputs
        net.admission.run()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("name", ["oddl", "electrical"])
def test_a_network_makes_no_cyclic_garbage_a_flow(root: Path, name: str) -> None:
    """The collector's young generation is large during a run (app/collector.py) because
    nothing a network makes a flow dies in a cycle: a run's cyclic garbage is the same few
    objects, give or take a handful, at 5 iterations and at 25 (320 flows more). A cycle a
    flow makes the collector's work (a flow network's finished flow and its finish event
    were one: multijob-1024's electrical baseline spent 1.0 s of its 3.5 s collecting
    them) and a run's memory grow by up to YOUNG objects between collections."""
    import gc

    from oddl.app.experiments.runner import lone_network

    def garbage(iterations: int) -> int:
        with lone_network(load_experiment(root / TABLE1), name, iterations, 0) as net:
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                net.admission.run()
                gc.collect()
                return len(gc.garbage)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()

    few = garbage(5)
    assert few < 100  # (a run's own: its tasks, a network's last events)
    assert garbage(25) <= few + 4  # a cycle a flow: 320 more


def test_a_command_leaves_what_it_made_to_the_os() -> None:
    """`oddl`'s entry point freezes the collector on its way out: Python's exit would walk
    every object a run made first (grid-4096's command: 1.1 s of 400 MB)."""
    code = ("import gc, sys\nsys.argv = ['oddl', '--version']\n"
            "from oddl.app.cli.main import entry\n"
            "try:\n    entry()\nexcept SystemExit:\n    print(gc.get_freeze_count())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert int(out.splitlines()[-1]) > 1000


def test_a_baseline_in_a_worker_still_tells_the_bus(root: Path) -> None:
    """A published run's notes for the dashboard (`announce`): a baseline run in a worker
    process has its notes relayed by this one, the same notes as when it runs here."""
    def notes(workers: int) -> list[tuple[str, bytes]]:
        got: list[tuple[str, bytes]] = []
        run_experiment(load_experiment(root / TABLE1), iterations=3, workers=workers,
                       announce=lambda kind, payload: got.append((kind, payload)))
        return [(k, p) for k, p in got if b"electrical" in p]

    here, there = notes(0), notes(1)
    assert here and len(there) == len(here)
    assert {k for k, _ in there} == {k for k, _ in here}


def test_a_store_writer_waits_its_turn_in_short_steps_and_loses_nothing(
        tmp_path: Path) -> None:
    """A run's processes share its store, each committing every iteration. SQLite's own
    wait for the write lock sleeps 1, 2, 5, 10 ms a turn (1.9 s of Table 1's
    --every-iteration run); a store's write waits in steps of 50 us to 1 ms instead
    (app/stores.py). One that cannot get the lock in time says so, and what it held is
    written by its next commit."""
    import threading

    from oddl.app.experiments.results import RunStore
    from oddl.app.stores import WAIT_FIRST_S, WAIT_MOST_S, write

    store = RunStore(tmp_path / "results.sqlite")
    store.begin_network("oddl", "oddl", {})
    other = sqlite3.connect(tmp_path / "results.sqlite", isolation_level=None,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's commit under way
    row = (0, 0, "n0", "n1", 100, 1, 10, 20)
    store.add_iteration("oddl", 0, 0, 100, 50, 3, [row], commit=False)  # held
    store.timeout_s = 0.05
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store.add_iteration("oddl", 1, 100, 200, 50, 3, [row])
    other.execute("COMMIT")
    store.add_iteration("oddl", 2, 200, 300, 50, 3, [row])  # with what the last one held

    # a write that finds the lock held waits, and lands once the other commits
    other.execute("BEGIN IMMEDIATE")
    releaser = threading.Thread(target=other.execute, args=("COMMIT",))

    def insert() -> None:
        try:
            store.db.execute("INSERT INTO networks VALUES ('electrical', 'x', '{}')")
        finally:
            if not releaser.is_alive() and releaser.ident is None:
                releaser.start()  # once the first try has found the lock held

    assert write(store.db, insert) >= 1
    releaser.join()
    store.close()
    data = read_store(tmp_path / "results.sqlite")
    assert [r[0] for r in data["oddl"]["iterations"]] == [0, 1, 2]
    assert data["oddl"]["flow_rows"] == 3 and "electrical" in data
    assert WAIT_FIRST_S < 1e-3 and WAIT_MOST_S <= 1e-3  # SQLite's first sleep is 1 ms


def test_a_store_of_a_newer_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 45: the SQLite stores carried no schema version; a file of a newer oddl is
    now refused, never half-read or written over (the results store, the ledger)."""
    from oddl.app.experiments.results import RunStore
    from oddl.app.ledger import Ledger
    from oddl.app.stores import StoreError

    for path, open_it in ((tmp_path / "results.sqlite", RunStore),
                          (tmp_path / "arbiter.sqlite", Ledger)):
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 99")
        db.commit()
        db.close()
        with pytest.raises(StoreError, match=rf"{path.name}: an? .* of schema 99, written by "
                                             r"a newer oddl; this one reads schema \d and older"):
            open_it(path)
    with pytest.raises(StoreError, match="schema 99"):
        read_store(tmp_path / "results.sqlite")
    fresh = RunStore(tmp_path / "new.sqlite")
    fresh.close()
    assert sqlite3.connect(tmp_path / "new.sqlite").execute(
        "PRAGMA user_version").fetchone()[0] == 1


@pytest.mark.realtime
def test_a_killed_runs_worker_ends_quietly(root: Path, tmp_path: Path) -> None:
    """Reproducer: `kill -9` of `oddl run` left its worker (the electrical network, in a
    process of its own) to find the pipe gone at its next progress report, and print two
    tracebacks on the terminal. It ends quietly; what it did is in the store."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "oddl.app", "run", str(root / TABLE1),
                             "--every-iteration", "--workers", "1", "--no-plot", "--out",
                             str(out)], cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    db = out / "results.sqlite"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            n = 0
            if db.exists():
                try:
                    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                    n = c.execute("SELECT COUNT(*) FROM iterations WHERE network = "
                                  "'electrical'").fetchone()[0]
                    c.close()
                except sqlite3.OperationalError:
                    n = 0
            if n >= 50:  # the worker is at work
                break
            time.sleep(0.05)  # polling interval, not a timing assumption
        assert proc.poll() is None, "run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)  # (stderr closes once the worker is gone)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
    assert len(read_store(db)["electrical"]["iterations"]) >= 50
