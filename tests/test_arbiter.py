"""`oddl arbiter` over an emulated 2 x 2 grid: people submit, cancel, wait; the service keeps
their jobs apart, refuses what it must, and survives its own `kill -9`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import dashboard, emulated_grid

JOB = """name = "{name}"
testbed = "-"
iterations = {iterations}
[workload]
model = "resnet50"
collective = "ring"
ranks = {ranks}
epochs = 1
dataset_samples = 1000
batch_per_node = 32
compute_time_ms = 10.0
"""


class Arbiter:
    """`oddl arbiter` as an operator starts it; its URL once it says "ready"."""

    def __init__(self, root: Path, emu: Path, state: Path, port: int = 0,
                 *extra: str) -> None:
        self.state = state
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oddl.app", "arbiter", str(emu), "--state",
             str(state), "--user", "alice", "--user", "bob", "--user", "eve:observer",
             "--user", "ops:operator", "--port", str(port), *extra], cwd=root,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killer = threading.Timer(60, self.proc.kill)  # it must come up within a minute
        killer.start()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        killer.cancel()
        assert line.startswith("ready http://127.0.0.1:"), (line, self.proc.stderr.read()
                                                             if self.proc.stderr else "")
        self.url = line.removeprefix("ready ")
        self.http = httpx.Client(timeout=30)  # one CA store load, kept connections (polls)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.err: list[str] = []  # what it says on stderr, drained (a full pipe blocks it)
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr or ()),
                         daemon=True).start()

    def token(self, user: str) -> str:
        return (self.state / "tokens" / user).read_text().strip()

    def call(self, user: str | None, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token(user)}"} if user else {}
        return self.http.request(method, self.url + path, headers=headers, **kw)

    def submit(self, user: str, name: str, iterations: int, ranks: int = 2) -> str:
        r = self.call(user, "POST", "/jobs", json={"experiment": JOB.format(
            name=name, iterations=iterations, ranks=ranks)})
        assert r.status_code == 201, r.text
        return str(r.json()["job"])

    def cli(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ODDL_ARBITER": self.url,
               "ODDL_TOKEN_FILE": str(self.state / "tokens" / user)}
        return subprocess.run([sys.executable, "-m", "oddl.app", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    def wait(self, user: str, job: str) -> subprocess.CompletedProcess[str]:
        """`oddl wait JOB --json`; if it does not end, what the arbiter says of the job."""
        try:
            return self.cli(user, "wait", job, "--json")
        except subprocess.TimeoutExpired:
            j = self.call("ops", "GET", f"/jobs/{job}").json()
            raise AssertionError((j, self.cli("ops", "logs", job).stdout,
                                  "".join(self.err)[-3000:])) from None

    def ended(self, user: str, job: str) -> dict[str, Any]:
        """The job once it has ended (two minutes at most), by the API."""
        t_end = time.monotonic() + 120
        while (j := self.call(user, "GET", f"/jobs/{job}").json())["state"] in (
                "queued", "running"):
            assert time.monotonic() < t_end, (j, self.cli("ops", "logs", job).stdout[-3000:],
                                              "".join(self.err)[-3000:])
            time.sleep(0.1)
        return dict(j)

    def until_done(self, user: str, job: str, n: int) -> None:
        """Until `job` has recorded `n` iterations (a minute at most)."""
        t_end = time.monotonic() + 60
        while self.call(user, "GET", f"/jobs/{job}").json()["iterations_done"] < n:
            assert time.monotonic() < t_end, f"{job}: fewer than {n} iterations in 60 s"
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Ctrl-C (issue 43: it printed KeyboardInterrupt and "Task was destroyed but it is
        pending"): stopped cleanly, exit 130, its state kept; or `sig`."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if sig == signal.SIGINT:
                t_end = time.monotonic() + 5
                while not any("stopped (SIGINT)" in e for e in self.err):
                    assert time.monotonic() < t_end, self.err[-20:]
                    time.sleep(0.01)  # the drain thread has the last lines
                said = "".join(self.err)
                assert self.proc.returncode == 130, said[-2000:]
                assert "Traceback" not in said and "destroyed" not in said, said[-3000:]
                assert f"every job's state is kept in {self.state}" in said


@pytest.fixture(scope="module")
def arbiter(root: Path, emu: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Arbiter]:
    """One arbiter serves the module's tests that need no arbiter of their own, one after
    another, as a lab's does (each test's jobs have ended when it returns); stopped by
    Ctrl-C at the end."""
    d = tmp_path_factory.mktemp("arbiter")
    (d / "limits.toml").write_text("[users.carol]\napproval = true\n")
    a = Arbiter(root, emu, d / "state", 0, "--user", "carol", "--limits",
                str(d / "limits.toml"))
    try:
        yield a
    finally:
        a.stop()


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_two_users_jobs_run_at_once_apart_and_finish(root: Path, emu: Path,
                                                     arbiter: Arbiter) -> None:
    with dashboard(root, emu) as url:
        a = arbiter.submit("alice", "a", 30)
        b = arbiter.submit("bob", "b", 30)
        done = {j: json.loads(arbiter.cli(u, "wait", j, "--json").stdout) for j, u in
                ((a, "alice"), (b, "bob"))}
        # the dashboard shows the queue (a retained note: the latest, whenever it came)
        t_end = time.monotonic() + 30
        while not (q := (st := arbiter.http.get(url + "api/state").json())["queue"]) or \
                [j["state"] for j in q["jobs"] if j["job"] in (a, b)] != ["finished"] * 2 \
                or (st["ended"] or {}).get("job") not in (a, b):
            assert time.monotonic() < t_end, q
            time.sleep(0.05)
        # a series each (issue 64: two jobs drew one), and the latest end, retained
        assert {f"oddl/{a}", f"oddl/{b}"} <= set(st["iterations"]), st["iterations"].keys()
        assert st["ended"]["state"] == "finished" and st["run"] is None
    assert [(j["job"], j["user"], j["done"]) for j in q["jobs"] if j["job"] in (a, b)] == [
        (a, "alice", 30), (b, "bob", 30)]
    assert [(d["state"], d["iterations_done"]) for d in done.values()] == [("finished", 30)] * 2
    assert done[a]["user"] == "alice" and done[b]["user"] == "bob"
    # disjoint partitions (rows 0 and 1), at once: each started before the other ended
    assert {done[a]["partition"].split(": ", 1)[1], done[b]["partition"].split(": ", 1)[1]} \
        == {"2 ranks, row 1 x 2 at row 0, col 0", "2 ranks, row 1 x 2 at row 1, col 0"}
    assert done[a]["started"] < done[b]["ended"] and done[b]["started"] < done[a]["ended"]
    status = arbiter.call("eve", "GET", "/status").json()
    assert status["invariant_violations"] == 0 and status["first_violations"] == []
    # each run directory's flows, as the ranks they were delivered to reported them, and
    # its outcome (issue 44: both tables were empty): a 2-rank ring, 2 flows a rank
    import sqlite3

    for j in (a, b):
        db = sqlite3.connect(Path(done[j]["run_dir"]) / "results.sqlite")
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT flow) FROM flows").fetchone() \
            == (30 * 4, 30 * 4)
        assert {f for (f,) in db.execute("SELECT flows FROM iterations")} == {4}
        assert all(src != dst and t0 <= t1 for src, dst, t0, t1 in db.execute(
            "SELECT src, dst, t_submit_ns, t_deliver_ns FROM flows"))
        # (on a busy machine, REQUESTs are retried: the job's own counters, as its result)
        [(_disturbed, dist)] = db.execute("SELECT disturbed, disturbance FROM outcomes")
        assert json.loads(dist) == done[j]["result"]["disturbance"]
    listed = arbiter.cli("eve", "jobs")
    assert listed.returncode == 0 and "alice" in listed.stdout and "bob" in listed.stdout
    assert listed.stdout.split()[:6] == ["job", "user", "state", "prio", "limit", "time"]


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_the_api_answers_while_partitions_are_set_up(root: Path, tmp_path: Path) -> None:
    """Issue 44: a partition's stage 1 ran on the arbiter's loop, so every request waited
    on the devices (3.4-6 s seen). Here each WSS's LCoS settles 1 s after an apply
    (`reconfig_ms`): a job's set-up takes that long, and the API answers meanwhile. A job
    cancelled while it is set up ends `cancelled`, its nodes given back; the other runs.
    A job that needs nodes still being given back waits for them (it failed at once, "no
    rectangle ... holds 4 ranks", while a release was under way and nothing ran).

    The cancel goes over HTTP, at once: `oddl cancel` (a process to start) once came after
    `gone` had been set up and run, on a machine with a core kept busy (409, "job j2 is
    running: nothing to cancel"); `gone` is set up for 2 s after `slow`'s 2 s."""
    with emulated_grid(root, tmp_path, reconfig_ms=2000) as emu:
        a = Arbiter(root, emu, tmp_path / "state")
        try:
            slow = a.submit("alice", "slow", 3)
            gone = a.submit("bob", "gone", 3)  # its stage 1 waits for slow's
            status = a.call("eve", "GET", "/status").json()  # answered before they end
            assert set(status["setting_up"]) == {slow, gone}, status
            assert status["free_nodes"] == 0
            whole = a.submit("bob", "whole", 2, ranks=4)  # once both are given back
            r = a.call("bob", "DELETE", f"/jobs/{gone}")
            assert r.status_code == 200 and r.json()["cancelled"], r.text
            again = a.call("bob", "DELETE", f"/jobs/{gone}")  # once is enough
            assert again.status_code == 409 and "nothing to cancel" in again.text, again.text
            assert a.ended("bob", gone)["state"] == "cancelled"
            out = json.loads(a.wait("alice", slow).stdout)
            assert (out["state"], out["iterations_done"]) == ("finished", 3), out
            out = json.loads(a.wait("bob", whole).stdout)
            assert (out["state"], out["iterations_done"]) == ("finished", 2), out
            status = a.call("eve", "GET", "/status").json()
            assert (status["setting_up"], status["free_nodes"]) == ({}, 4), status
            assert status["invariant_violations"] == 0, status
            said = "".join(a.err)
            assert "reads back a table other than" not in said, said[-3000:]
        finally:
            a.stop()


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_an_approve_gate_holds_a_users_jobs_until_an_operator_releases_them(
        arbiter: Arbiter) -> None:
    """Issue 44 (what labs ask of a job service): an approve gate. carol's jobs wait,
    held, with free nodes, until an operator releases them; bob's are not gated."""
    a = arbiter
    gated = a.submit("carol", "gated", 3)
    assert a.call("carol", "GET", f"/jobs/{gated}").json()["held"] is True
    assert json.loads(a.wait("bob", a.submit("bob", "free", 3)).stdout)["state"] \
        == "finished"  # the grid was free all along
    assert a.call("carol", "GET", f"/jobs/{gated}").json()["state"] == "queued"
    assert a.call("carol", "POST", f"/jobs/{gated}/release").status_code == 403
    assert a.cli("ops", "release", gated).returncode == 0
    assert json.loads(a.wait("carol", gated).stdout)["state"] == "finished"
    log = a.cli("carol", "logs", gated).stdout
    assert "held for an operator's approval" in log and "released by ops" in log, log


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_user_cannot_cancel_anothers_job(arbiter: Arbiter) -> None:
    a = arbiter.submit("alice", "a", 60)
    r = arbiter.cli("bob", "cancel", a)
    assert r.returncode == 2 and f"403: job {a} is alice's, not bob's" in r.stderr, r.stderr
    out = arbiter.cli("alice", "wait", a)
    assert out.returncode == 0 and "finished; 60/60 iterations" in out.stdout, out.stdout
    assert "queued by alice" in arbiter.cli("alice", "logs", a).stdout
    assert arbiter.cli("bob", "logs", a).returncode == 2


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_cancelling_a_running_job_gives_its_nodes_to_the_next(arbiter: Arbiter) -> None:
    big = arbiter.submit("alice", "big", 100_000, ranks=4)  # the whole grid, for ever
    nxt = arbiter.submit("bob", "next", 10)  # waits for it
    arbiter.until_done("alice", big, 3)
    assert arbiter.call("bob", "GET", f"/jobs/{nxt}").json()["state"] == "queued"
    r = arbiter.cli("alice", "cancel", big)
    assert r.returncode == 0, r.stderr
    assert json.loads(arbiter.cli("bob", "wait", nxt, "--json").stdout)["state"] == "finished"
    gone = arbiter.cli("alice", "wait", big, "--json")
    assert gone.returncode == 1 and json.loads(gone.stdout)["why"] == "cancelled by alice"
    # issue 44: the partition went to the next job before the cancelled one's node
    # programs had dropped it: its light met the next job's on a WSS (violations)
    status = arbiter.call("alice", "GET", "/status").json()
    assert (status["invariant_violations"], status["first_violations"]) == (0, []), status


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_junk_and_strangers_get_a_4xx_and_change_nothing(arbiter: Arbiter) -> None:
    before = arbiter.call("eve", "GET", "/jobs").json()
    rejected = arbiter.call("eve", "GET", "/status").json()["rejected"]
    cases = [
        (None, "GET", "/jobs", {}, 401),
        ("alice", "POST", "/jobs", {"content": b"{not json"}, 400),
        ("alice", "POST", "/jobs", {"content": b"[" * 300_000}, 413),
        ("alice", "POST", "/jobs", {"json": {"experiment": 7}}, 422),
        ("alice", "POST", "/jobs", {"json": {"experiment": "x = [", "priority": 0}}, 422),
        ("alice", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="huge", iterations=5, ranks=5)}}, 422),  # no rectangle of 2 x 2 holds 5
        ("eve", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="x", iterations=5, ranks=2)}}, 403),  # an observer reads only
        ("alice", "DELETE", "/jobs/j999", {}, 404),
        # issue 44: nested TOML gave a 500 and a RecursionError in the log
        ("alice", "POST", "/jobs", {"json": {"experiment": "a = " + "[" * 5000 + "]" * 5000}},
         422),
        ("alice", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="x", iterations=5, ranks=2), "priority": 500}}, 403),  # over a user's 100
        ("alice", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="x", iterations=5, ranks=2), "time_limit_s": 1e6}}, 422),  # over the most
        ("alice", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="x", iterations=5, ranks=2) + "\n[[faults]]\nkind = 'node'\nnode = 'zz'\n"
            "at_ms = 1\n"}}, 422),  # the one validation: a fault on no node of the testbed
        ("alice", "POST", "/jobs/j1/hold", {}, 403),  # an operator's
        # issue 86: an unknown field was ignored silently
        ("alice", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="x", iterations=5, ranks=2), "callback": "http://127.0.0.1:1/"}}, 422),
        # a webhook where this arbiter allows none ([notices] allow)
        ("alice", "POST", "/jobs", {"json": {"experiment": JOB.format(
            name="x", iterations=5, ranks=2), "webhook": "http://127.0.0.1:1/"}}, 422),
        ("alice", "GET", "/jobs/j999/iterations", {}, 404),
    ]
    for user, method, path, kw, status in cases:
        r = arbiter.call(user, method, path, **kw)
        assert r.status_code == status, (user, method, path, r.status_code, r.text)
    bad = httpx.get(arbiter.url + "/jobs", headers={"Authorization": "Bearer forged"})
    assert bad.status_code == 401
    assert arbiter.call("alice", "POST", "/jobs", json={"experiment": "x", "callback": 1}
                        ).json()["error"].startswith("callback: not a field of a submission")
    # the body is a typed struct: a field of the wrong kind is named, with what it must be
    for field, value, says in (("priority", True, "Expected `int`, got `bool` - at "
                                "`priority`"), ("singleton", 1, "Expected `bool`, got `int`"),
                               ("time_limit_s", -1, "Expected `float` > 0.0"),
                               ("array", [0, 1], "Expected `str | null`, got `array`")):
        r = arbiter.call("alice", "POST", "/jobs", json={"experiment": JOB.format(
            name="x", iterations=5, ranks=2), field: value})
        assert r.status_code == 422 and r.json()["error"].startswith(says), r.text
    assert "workload.ranks: 5 ranks but" in arbiter.call("alice", "POST", "/jobs", json={
        "experiment": JOB.format(name="huge", iterations=5, ranks=5)}).json()["error"]
    assert not any("Traceback" in e or "RecursionError" in e for e in arbiter.err)
    assert arbiter.call("eve", "GET", "/jobs").json() == before
    assert arbiter.call("eve", "GET", "/status").json()["rejected"] == rejected + len(
        cases) + 3 + 4


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_query_numbers_out_of_range_are_a_422_not_a_500(arbiter: Arbiter) -> None:
    """Reproducer (issue 64): `flows?after=` or `iterations?since=` of 2**63 and
    `usage?since=nan` answered 500, a traceback in the log (10 of 10)."""
    job = arbiter.submit("alice", "q", 2)
    arbiter.ended("alice", job)
    for path in (f"/jobs/{job}/iterations?since={2**63}", f"/jobs/{job}/flows?after={2**63}",
                 f"/jobs/{job}/flows?after=-1", "/usage?since=nan", "/usage?since=inf",
                 "/usage?since=1e400", f"/jobs/{job}/iterations?since=x"):
        r = arbiter.call("alice", "GET", path)
        assert r.status_code == 422, (path, r.status_code, r.text)
        assert r.json()["error"].split(":")[0] in ("since", "after"), r.text
    assert arbiter.call("alice", "GET", f"/jobs/{job}/iterations?since=1").json()[
        "iterations"][0][0] == 1
    assert not any("Traceback" in e for e in arbiter.err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("users", [["alice", "ops:operator", "eve:observer"]])
def test_tokens_are_private_and_kept_across_starts(tmp_path: Path, users: list[str]) -> None:
    from oddl.app.users import tokens

    first = tokens(tmp_path, users)
    assert sorted((u.name, u.role) for u in first.values()) == [
        ("alice", "user"), ("eve", "observer"), ("ops", "operator")]
    d = tmp_path / "tokens"
    assert d.stat().st_mode & 0o777 == 0o700
    assert all((d / n).stat().st_mode & 0o777 == 0o600 for n in ("alice", "ops", "eve"))
    assert tokens(tmp_path, users) == first  # a later start keeps them
    with pytest.raises(ValueError, match="role 'root' is not one of operator, user, observer"):
        tokens(tmp_path, ["mallory:root"])


def test_the_arbiter_owns_devices_not_models(root: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from oddl.app.cli import main

    r = CliRunner().invoke(main, ["arbiter", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--state", str(tmp_path / "s"), "--user", "alice"])
    assert r.exit_code == 2 and "testbed.backend: the arbiter owns devices" in r.output
    r = CliRunner().invoke(main, ["arbiter", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--state", str(tmp_path / "s"), "--user", "alice",
                                  "--host", "0.0.0.0"])
    assert r.exit_code == 2 and "--host 0.0.0.0: beyond loopback the API needs TLS" in r.output


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_oddl_run_on_hw_submits_to_the_testbeds_arbiter(arbiter: Arbiter, emu: Path,
                                                        tmp_path: Path) -> None:
    """Reproducer: `oddl run --backend hw` on a testbed an arbiter serves failed on the lock.
    With the arbiter named it submits the ODDL network's job and waits; the baseline runs
    here, as it does on every back end."""
    exp = tmp_path / "e.toml"
    exp.write_text(JOB.format(name="via-run", iterations=12, ranks=2).replace(
        'testbed = "-"', f'testbed = "{emu}"') + '[[networks]]\nname = "oddl"\nkind = "oddl"\n'
        '[[networks]]\nname = "electrical"\nkind = "electrical"\n')
    cmd = ["run", str(exp), "--backend", "hw", "--json"]
    held = arbiter.cli("alice", *cmd, "--out", str(tmp_path / "held"), "--arbiter", "")
    assert held.returncode == 3 and "oddl arbiter" in held.stderr, held.stderr
    assert "`oddl run --backend hw` submits to it" in held.stderr
    r = arbiter.cli("alice", *cmd, "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["networks"]["oddl"]["iterations"] == 12 and out["ratio"] > 0
    assert out["networks"]["electrical"]["iterations"] == 12
    job = arbiter.call("eve", "GET", "/jobs").json()["jobs"][-1]  # the latest
    assert (job["user"], job["state"], job["iterations_done"]) == ("alice", "finished", 12)
    # the run directory holds the ODDL job's flows and outcome, as the arbiter's does
    # (issue 44: both tables were empty; 4 flows an iteration: a 2-rank ring)
    from oddl.app.experiments.results import read_store

    store = read_store(tmp_path / "run" / "results.sqlite")["oddl"]
    assert store["flow_rows"] == 12 * 4 and {r[5] for r in store["iterations"]} == {4}
    assert "disturbed" in store
    assert arbiter.call("eve", "GET", f"/jobs/{job['job']}/flows").status_code == 403
    page = arbiter.call("alice", "GET", f"/jobs/{job['job']}/flows?after=40").json()
    assert (len(page["flows"]), page["more"]) == (8, False)


def test_tokens_too_short_or_shared_are_refused_at_start(tmp_path: Path) -> None:
    """Issue 44: a 1-character token was accepted, and two users with one token resolved
    to the later one (bob's job was cancelled "as ops")."""
    from oddl.app.users import tokens

    d = tmp_path / "tokens"
    tokens(tmp_path, ["alice", "bob"])
    assert all(len((d / n).read_text()) >= 43 for n in ("alice", "bob"))  # 256 bits
    (d / "bob").write_text("x")
    with pytest.raises(ValueError, match="bob: a token of at least 22 characters"):
        tokens(tmp_path, ["alice", "bob"])
    (d / "bob").write_text((d / "alice").read_text())
    with pytest.raises(ValueError, match="bob: the same token as alice's"):
        tokens(tmp_path, ["alice", "bob"])
    (d / "bob").write_bytes(b"\xff" * 40)
    with pytest.raises(ValueError, match="bob: not UTF-8 text"):
        tokens(tmp_path, ["alice", "bob"])


def test_a_corrupt_row_is_quarantined_and_the_rest_served(tmp_path: Path) -> None:
    """Issue 44: one job row whose request is `{}` stopped the arbiter from starting."""
    import dataclasses

    from oddl.app.ledger import Ledger
    from oddl.controller.service.jobs import JobRequest

    ledger = Ledger(tmp_path / "arbiter.sqlite")
    good = JobRequest("j1", "resnet50", "ring", 2, 10, 1, 0, "any", 1)
    ledger.add("alice", good)
    ledger.add("bob", dataclasses.replace(good, name="j2"))
    ledger.db.execute("UPDATE jobs SET request = '{}' WHERE id = 'j2'")
    ledger.db.commit()
    assert [(j, r) for j, r, _ in ledger.unfinished()] == [("j1", good)]
    j2 = ledger.job("j2")
    assert j2 is not None and j2["state"] == "quarantined"
    assert "its record in the ledger cannot be read" in j2["why"]
    assert [j["job"] for j in ledger.jobs()] == ["j1", "j2"]  # both still listed
    ledger.close()


def test_a_corrupt_ledger_or_another_testbeds_state_is_refused_in_one_line(
        tmp_path: Path) -> None:
    from oddl.app.ledger import Ledger
    from oddl.app.stores import StoreError

    bad = tmp_path / "arbiter.sqlite"
    bad.write_bytes(b"this is no database" * 100)
    with pytest.raises(StoreError, match="not an arbiter's ledger"):
        Ledger(bad)
    ledger = Ledger(tmp_path / "good.sqlite")
    assert ledger.testbed("t2x2") is None  # recorded at its first start
    assert ledger.testbed("t2x2") is None
    assert ledger.testbed("grid-64") == "t2x2"  # another testbed: the one it is for
    ledger.close()


def test_the_time_no_arbiter_ran_is_counted_between_its_lives(tmp_path: Path) -> None:
    from oddl.app.ledger import Ledger

    ledger = Ledger(tmp_path / "a.sqlite")
    assert ledger.begin(1) is None
    ledger.db.execute("UPDATE lives SET started = 100, seen = 110")
    ledger.db.execute("INSERT INTO lives VALUES (2, 130, 150)")  # 20 s with none
    ledger.db.execute("INSERT INTO lives VALUES (3, 155, 160)")  # 5 s more
    assert ledger.down_s(0, 200) == 25
    assert ledger.down_s(120, 140) == 10  # the part within
    assert ledger.down_s(131, 150) == 0
    ledger.close()


LIMITS = """
default_time_limit_s = 600
max_time_limit_s = 3600
[roles.user]
max_queued_jobs = 2
max_running_nodes = 2
max_priority = 10
"""
