"""`oddl arbiter` across its own `kill -9`, and a new one after a killed one (issue 44):
apart from tests/test_arbiter.py, whose arbiter serves its module's tests, so that the
modules' emulators and arbiters run side by side."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_arbiter import Arbiter, free_port


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_killed_arbiter_started_again_loses_no_job_and_records_no_iteration_twice(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Issue 44: after a restart a job's result covered only the part after it (39 of 60
    iterations, a JCT of 12.2 s for 22.5 s), and `oddl wait` died with the arbiter
    ("Connection reset by peer", exit 2)."""
    port = free_port()
    first = Arbiter(root, emu, tmp_path / "state", port)
    waiting = None
    try:
        running = first.submit("alice", "long", 60)
        queued = first.submit("bob", "after", 20, ranks=4)  # waits for the whole grid
        waiting = subprocess.Popen(  # a user's `oddl wait`, from before the kill
            [sys.executable, "-m", "oddl.app", "wait", running, "--json"],
            env={**os.environ, "ODDL_ARBITER": first.url,
                 "ODDL_TOKEN_FILE": str(tmp_path / "state" / "tokens" / "alice")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first.until_done("alice", running, 20)
    finally:
        first.stop(signal.SIGKILL)
    t_killed = time.time()
    again = Arbiter(root, emu, tmp_path / "state", port, "--plots")  # the same tokens, ledger
    try:
        for job, user, n in ((running, "alice", 60), (queued, "bob", 20)):
            d = json.loads(again.cli(user, "wait", job, "--json").stdout)
            assert (d["state"], d["iterations_done"]) == ("finished", n), d
            r = d["result"]
            assert r["iterations"] == n, r  # every iteration, before the kill and after
            assert r["jct_s"] == pytest.approx(d["ended"] - d["submitted"], abs=1e-3)
            assert 0 < r["arbiter_down_s"] < time.time() - t_killed + 2, r
        assert d["started"] > t_killed  # the queued one started under the second arbiter
        # its run directory, in `oddl run`'s layout, whole across the kill (issue 44: a
        # submitted job had none)
        from oddl.app.experiments.results import read_store

        d = json.loads(again.cli("alice", "wait", running, "--json").stdout)
        run_dir = Path(d["run_dir"])
        assert run_dir == tmp_path / "state" / "runs" / running
        assert {"experiment.toml", "manifest.json", "summary.json"} <= {
            p.name for p in run_dir.iterdir()}
        deadline = time.monotonic() + 30  # the plot is drawn beside the API, after the end
        while not (run_dir / "plot.png").is_file():
            assert time.monotonic() < deadline, "no plot.png 30 s after the job ended"
            time.sleep(0.05)
        assert len(read_store(run_dir / "results.sqlite")["oddl"]["iterations"]) == 60
        assert json.loads((run_dir / "summary.json").read_text())["state"] == "finished"
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err[-2000:]
        assert json.loads(out)["result"]["iterations"] == 60
        log = again.cli("alice", "logs", running).stdout
        assert "the arbiter started again (no arbiter for" in log, log
        assert "queued again from iteration" in log
        assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d{4} queued by alice",
                         log, re.M), log  # a full timestamp, with its date
    finally:
        again.stop()
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
    db = sqlite3.connect(tmp_path / "state" / "arbiter.sqlite")
    for job, n in ((running, 60), (queued, 20)):
        its = [i for (i,) in db.execute("SELECT iteration FROM iterations WHERE job = ? "
                                        "ORDER BY iteration", (job,))]
        assert its == list(range(n))  # each once (the key), none missing


@pytest.mark.realtime  # an emulator, two arbiters, HTTP: the wall clock
def test_a_new_arbiter_on_an_emulator_a_killed_one_served_starts_clean(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Reproducer (issue 43): a long-lived emulator faked invariant violations for a second
    arbiter (`/status` said 100, 150 after kill -9 restarts), its node reports naming a job
    of an arbiter long gone. The nodes drop an earlier controller's job when a newer one
    comes (its session, in its status and its jobs); the new arbiter clears the WSS rows
    and routes it finds; each node reports its own job's violations."""
    first = Arbiter(root, emu, tmp_path / "a")
    try:
        first.until_done("alice", first.submit("alice", "forever", 100_000), 3)
    finally:
        first.stop(signal.SIGKILL)  # its job is still on the nodes, its will not yet said
    fresh = Arbiter(root, emu, tmp_path / "b")
    try:
        jobs = [fresh.submit("alice", f"j{k}", 10) for k in range(2)]
        for job in jobs:
            d = json.loads(fresh.cli("alice", "wait", job, "--json").stdout)
            assert (d["state"], d["iterations_done"]) == ("finished", 10), d
        status = fresh.call("alice", "GET", "/status").json()
        assert (status["invariant_violations"], status["first_violations"]) == (0, []), status
    finally:
        fresh.stop()


@pytest.mark.realtime  # an emulator, two arbiters, HTTP: the wall clock
def test_an_arbiter_stopped_with_a_job_running_stops_at_once_and_resumes_it(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Reproducer (issue 62): Ctrl-C of an arbiter with a job running took the testbed's
    `grace_ms` (5.3 to 7.5 s) and warned "no word from n0, ... that it dropped the job",
    although every node had dropped it within 0.6 s: the controller stopped listening
    before it asked. Now it asks first, hears the nodes, and exits at once; the job is
    kept and a new arbiter on the state goes on with it."""
    port = free_port()
    first = Arbiter(root, emu, tmp_path / "state", port)
    job = first.submit("alice", "long", 100_000)
    first.until_done("alice", job, 3)
    first.stop()  # SIGINT: exit 130, no traceback, its state kept (Arbiter.stop checks)
    said = "".join(first.err)
    # every node's answer was heard: nothing waited out grace_ms for it
    assert "no word from" not in said, said[-3000:]
    again = Arbiter(root, emu, tmp_path / "state", port)
    try:
        again.until_done("alice", job, 6)  # queued again, and running on
        r = again.call("alice", "DELETE", f"/jobs/{job}")
        assert r.status_code == 200, (r.text, "".join(again.err)[-3000:])
        assert again.ended("alice", job)["state"] == "cancelled"
    finally:
        again.stop()
    assert "no word from" not in "".join(again.err)


@pytest.mark.realtime  # two arbiters, HTTP: the wall clock
def test_a_revoked_token_stays_revoked_across_a_restart(root: Path, emu: Path,
                                                        tmp_path: Path) -> None:
    """Reproducer (issue 64): `oddl token bob --revoke` deleted bob's token file, and any
    restart of the arbiter minted a new one: bob's requests answered 200 again."""
    port = free_port()
    first = Arbiter(root, emu, tmp_path / "state", port)
    try:
        old = first.token("bob")
        assert first.call("ops", "DELETE", "/tokens/bob").status_code == 200
        assert first.http.get(first.url + "/jobs", headers={
            "Authorization": f"Bearer {old}"}).status_code == 401
    finally:
        first.stop()
    again = Arbiter(root, emu, tmp_path / "state", port)
    try:
        assert not (tmp_path / "state" / "tokens" / "bob").exists()  # none minted
        assert again.http.get(again.url + "/jobs", headers={
            "Authorization": f"Bearer {old}"}).status_code == 401
        # an operator gives bob a token again: rotated, it works, and survives restarts
        assert again.call("ops", "POST", "/tokens/bob").status_code == 200
        assert again.call("bob", "GET", "/jobs").status_code == 200
    finally:
        again.stop()
    assert not (tmp_path / "state" / "tokens" / "bob.revoked").exists()


def test_an_iteration_run_again_after_a_kill_replaces_its_first_record(tmp_path: Path
                                                                       ) -> None:
    """The arbiter writes an iteration to the job's run directory before its ledger: killed
    between the two (a soak saw 59 of 60 iterations in the run directory when the ledger
    went first), the resumed job runs that iteration again, and its second record replaces
    the first, flows and all."""
    from oddl.app.experiments.results import read_store
    from oddl.app.job_runs import JobRuns

    runs = JobRuns(tmp_path, plots=False)
    runs.path("j1").mkdir(parents=True)  # (begin's, at submission)
    flow = (0, 0, "n0-0", "n0-1", 100, 1, 10, 20)
    runs.iteration("j1", 0, 0, 50, 5, 3, [flow])
    runs.iteration("j1", 1, 50, 90, 5, 3, [flow])  # then killed before the ledger's
    runs.iteration("j1", 1, 70, 130, 5, 3, [(1, 0, "n0-0", "n0-1", 100, 1, 80, 95)])
    runs.close()
    path = runs.path("j1") / "results.sqlite"
    got = read_store(path)["oddl"]
    assert [r[:2] for r in got["iterations"]] == [(0, 0), (1, 70)]
    db = sqlite3.connect(path)
    assert db.execute("SELECT iteration, flow FROM flows ORDER BY iteration").fetchall() == [
        (0, 0), (1, 1)]
    db.close()
