"""`oddl arbiter` for a lab's operators (issue 64): the lab day's defects, and what a Slurm
admin expects to see and do (jobs with why they wait, status, drain, dependencies, fair
share, users at run time), on an emulator of its own."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_testbed
from tests.test_arbiter import JOB, Arbiter


def _until(what: str, ok: Any, deadline_s: float = 60) -> Any:
    """Poll `ok()` until it is truthy (its value), `deadline_s` at most."""
    t_end = time.monotonic() + deadline_s
    while not (got := ok()):
        assert time.monotonic() < t_end, f"not {what} within {deadline_s} s"
        time.sleep(0.05)
    return got


def _job(a: Arbiter, user: str, job: str) -> dict[str, Any]:
    return dict(a.call(user, "GET", f"/jobs/{job}").json())


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_cancelling_the_queue_in_order_fails_no_job_and_keeps_every_record(
        arb: Arbiter) -> None:
    """Reproducer (issue 64): with 60 queued 4-rank jobs, cancelling them in order left 59
    `failed` ("no rectangle of the nodes in service holds 4 ranks") without running, and
    some DELETEs answered 500 (a RecursionError): a queued job's cancel, while the running
    one's light was landing, found every node "free" and nothing fitting. And a cancelled
    job's record said `flows: 0, control_messages: 0` though its run directory held its
    flows."""
    first = arb.submit("alice", "first", 1_000_000, ranks=4)
    arb.until_done("alice", first, 3)
    queued = [arb.submit("alice", f"q{k}", 1_000_000, ranks=4) for k in range(12)]
    codes = [arb.call("alice", "DELETE", f"/jobs/{j}").status_code for j in [first, *queued]]
    assert codes == [200] * 13, codes
    ended = [arb.ended("alice", j) for j in [first, *queued]]
    assert [(j["job"], j["state"]) for j in ended] == [(j, "cancelled") for j in
                                                      [first, *queued]], ended
    assert not any("Traceback" in e or "RecursionError" in e for e in arb.err)
    r = ended[0]["result"]
    assert r["iterations"] >= 3 and r["flows"] >= 3 * 4 and r["control_messages"] > 0, r
    assert r["invariant_violations"] == 0 and "disturbance" in r, r
    assert [j["result"]["nodes"] for j in ended[1:]] == [0] * 12  # none ever held a node


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_drained_node_takes_no_job_and_jobs_say_why_they_wait(arb: Arbiter) -> None:
    """Issue 64: `oddl drain`/`resume`; `oddl status` shows each node; `oddl jobs` names
    why each queued job waits; the jobs behind one that cannot start go on round it."""
    r = arb.cli("ops", "drain", "n0-0", "--reason", "fibre swap")
    assert r.returncode == 0 and "n0-0 drained: fibre swap" in r.stdout, r.stderr
    assert arb.call("alice", "POST", "/nodes/n0-0/drain",
                    json={"reason": "x"}).status_code == 403  # an operator's
    whole = arb.submit("alice", "whole", 5, ranks=4)  # needs n0-0: waits, blocks nobody
    small = arb.submit("bob", "small", 5, ranks=2)
    assert json.loads(arb.wait("bob", small).stdout)["state"] == "finished"
    j = _job(arb, "alice", whole)
    assert (j["state"], j["reason"]) == ("queued", "nodes out of service"), j
    st = json.loads(arb.cli("eve", "status", "--json").stdout)
    assert st["nodes"]["n0-0"] == {"state": "drained", "why": "drained by ops: fibre swap"}
    assert st["free_nodes"] == 3, st
    shown = arb.cli("eve", "jobs", "--state", "queued")
    assert f"{whole:>5} alice" in shown.stdout and "nodes out of service" in shown.stdout
    held = arb.submit("bob", "held", 5, ranks=4)
    assert arb.cli("ops", "hold", held).returncode == 0
    assert _job(arb, "bob", held)["reason"] == "held"
    r = arb.cli("ops", "resume", "n0-0")
    assert r.returncode == 0, r.stderr
    assert json.loads(arb.wait("alice", whole).stdout)["state"] == "finished"
    assert _job(arb, "bob", held)["reason"] == "held"
    arb.cli("ops", "cancel", held)
    assert arb.call("eve", "GET", "/status").json()["nodes"]["n0-0"] == {"state": "free"}


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_dependent_job_starts_after_its_parent_or_never(arb: Arbiter, tmp_path: Path
                                                          ) -> None:
    """Issue 64: `oddl submit --after ID[:ok]`."""
    # the parent waits behind a job that holds the grid until it is cancelled: what the
    # child is seen to wait for does not depend on how fast the machine runs the parent
    blocker = arb.submit("ops", "blocker", 1_000_000, ranks=4)
    parent = arb.submit("alice", "parent", 5, ranks=2)
    exp = tmp_path / "child.toml"
    exp.write_text(JOB.format(name="child", iterations=5, ranks=2))
    r = arb.cli("alice", "submit", str(exp), "--after", f"{parent}:ok", "--json")
    assert r.returncode == 0, r.stderr
    child = json.loads(r.stdout)["job"]
    j = _job(arb, "alice", child)
    assert j["state"] == "queued" and j["reason"] == f"dependency on {parent}", j
    arb.cli("ops", "cancel", blocker)
    done = json.loads(arb.wait("alice", child).stdout)
    p = _job(arb, "alice", parent)
    assert done["state"] == "finished" and done["started"] >= p["ended"], (done, p)
    # a parent that does not finish: the `:ok` child never starts, and says why
    doomed = arb.submit("alice", "doomed", 1_000_000, ranks=2)
    r = arb.cli("alice", "submit", str(exp), "--after", f"{doomed}:ok", "--json")
    orphan = json.loads(r.stdout)["job"]
    arb.cli("alice", "cancel", doomed)
    o = arb.ended("alice", orphan)
    assert (o["state"], o["why"]) == ("cancelled", f"its dependency {doomed} ended "
                                                   f"cancelled, not finished"), o
    # `:notok`: after a parent that did not finish (a clean-up); never after one that did
    doomed = arb.submit("alice", "doomed2", 1_000_000, ranks=2)
    r = arb.cli("alice", "submit", str(exp), "--after", f"{doomed}:notok", "--json")
    cleanup = json.loads(r.stdout)["job"]
    assert _job(arb, "alice", cleanup)["reason"] == f"dependency on {doomed}"
    arb.cli("alice", "cancel", doomed)
    assert json.loads(arb.wait("alice", cleanup).stdout)["state"] == "finished"
    r = arb.cli("alice", "submit", str(exp), "--after", f"{child}:notok", "--json")
    skipped = arb.ended("alice", json.loads(r.stdout)["job"])
    assert (skipped["state"], skipped["why"]) == (
        "cancelled", f"its dependency {child} ended finished (it was to run only if not)")
    assert o["started"] is None
    # a dependency on nobody's job, or bob's: refused
    for after, code in (("j99999", 404), (parent, 403), ("x; drop", 422)):
        got = arb.call("bob", "POST", "/jobs", json={"experiment": exp.read_text(),
                                                     "after": after})
        assert got.status_code == code, (after, got.text)


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_heavy_users_job_starts_after_a_light_users_of_the_same_priority(
        arb: Arbiter) -> None:
    """Issue 64: fair share. alice has held the grid; bob has held nothing: their jobs of
    the same base priority, queued behind a job that holds the grid, start bob's first."""
    heavy = arb.submit("alice", "heavy", 60, ranks=4)
    assert json.loads(arb.wait("alice", heavy).stdout)["state"] == "finished"
    blocker = arb.submit("ops", "blocker", 1_000_000, ranks=4)
    arb.until_done("ops", blocker, 2)
    a = arb.submit("alice", "a", 5, ranks=4)
    b = arb.submit("bob", "b", 5, ranks=4)
    shown = {j["job"]: j for j in json.loads(arb.cli("eve", "jobs", "--json").stdout)}
    assert shown[a]["priority"] == shown[b]["priority"] == 0  # their base
    assert shown[b]["share"] > shown[a]["share"], (shown[a], shown[b])
    prio = arb.cli("eve", "jobs", "--priority")
    assert "share" in prio.stdout and f"{a:>5} alice" in prio.stdout
    arb.cli("ops", "cancel", blocker)
    ja, jb = arb.ended("alice", a), arb.ended("bob", b)
    assert (ja["state"], jb["state"]) == ("finished", "finished")
    assert jb["started"] < ja["started"], (ja, jb)


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_users_drains_and_windows_set_at_run_time_are_kept_across_a_restart(
        root: Path, emu: Path, tmp_path: Path) -> None:
    a = Arbiter(root, emu, tmp_path / "state", 0)
    try:
        r = a.cli("ops", "user", "add", "dave")
        assert r.returncode == 0 and "dave: user, token in" in r.stdout, r.stderr
        assert a.call("dave", "GET", "/jobs").status_code == 200
        assert a.cli("alice", "user", "add", "mallory").returncode == 2  # an operator's
        token, bobs = a.token("dave"), a.token("bob")
        assert a.cli("ops", "user", "remove", "bob").returncode == 0
        assert a.call("ops", "POST", "/maintenance", json={
            "nodes": ["n1-0"], "start": time.time() + 3600, "end": time.time() + 7200,
            "reason": "laser swap"}).status_code == 201
        assert a.cli("ops", "drain", "n0-1", "--reason", "flaky link").returncode == 0
        assert a.http.get(a.url + "/jobs", headers={
            "Authorization": f"Bearer {bobs}"}).status_code == 401
    finally:
        a.stop()
    b = Arbiter(root, emu, tmp_path / "state", 0)  # its --user list names bob again
    try:
        assert a.token("dave") == token
        assert b.call("dave", "GET", "/jobs").status_code == 200
        assert not (tmp_path / "state" / "tokens" / "bob").exists()  # not minted again
        st = b.call("eve", "GET", "/status").json()  # drains and windows kept too
        assert [(w["nodes"], w["why"]) for w in st["maintenance"]] == [(["n1-0"],
                                                                        "laser swap")]
        assert st["nodes"]["n0-1"]["state"] == "drained"
    finally:
        b.stop()


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_maintenance_window_keeps_jobs_off_its_nodes_until_it_ends(arb: Arbiter) -> None:
    """Issue 64: maintenance reservations (nodes and a window): a job that would run into
    one waits, saying so; one that fits elsewhere runs; once it ends, the job starts."""
    end = float(int(time.time() + 8))  # (`--end` is to the second)
    r = arb.cli("ops", "maintenance", "add", "n0-0", "--reason", "fibre swap", "--end",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end)))
    assert r.returncode == 0 and "maintenance 1: n0-0 until" in r.stdout, r.stderr
    st = arb.call("eve", "GET", "/status").json()
    assert st["nodes"]["n0-0"] == {"state": "maintenance",
                                   "why": "maintenance by ops: fibre swap"}
    assert [w["nodes"] for w in st["maintenance"]] == [["n0-0"]]
    whole = arb.submit("alice", "whole", 5, ranks=4)
    j = _job(arb, "alice", whole)
    assert j["state"] == "queued" and j["reason"].startswith("maintenance"), j
    pair = arb.submit("bob", "pair", 5, ranks=2)
    assert json.loads(arb.wait("bob", pair).stdout)["state"] == "finished"
    done = json.loads(arb.wait("alice", whole).stdout)
    assert done["state"] == "finished" and done["started"] >= end, (done, end)
    # a window to come, listed by `oddl status`, taken back; what is no window refused
    later = {"nodes": ["n1-1"], "start": time.time() + 3600, "end": time.time() + 7200,
             "reason": "x"}
    w = arb.call("ops", "POST", "/maintenance", json=later).json()
    assert f"maintenance {w['id']}: n1-1 from" in arb.cli("eve", "status").stdout
    assert arb.call("ops", "DELETE", f"/maintenance/{w['id']}").status_code == 200
    assert arb.call("ops", "DELETE", f"/maintenance/{w['id']}").status_code == 404
    # an id no SQLite integer holds is refused by its shape, not a 500 (issue 85)
    for bad_id in ("9223372036854775808", "1" * 40, "-1", "x"):
        assert arb.call("ops", "DELETE", f"/maintenance/{bad_id}").status_code == 422
    for bad in ({**later, "nodes": ["n9-9"]}, {**later, "end": later["start"] - 1},
                {**later, "end": float("nan")}, {**later, "reason": ""}):
        assert arb.call("ops", "POST", "/maintenance", content=json.dumps(bad)
                        ).status_code in (400, 422)
    assert arb.call("alice", "POST", "/maintenance", json=later).status_code == 403


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_reservation_keeps_its_nodes_for_its_users_jobs(arb: Arbiter) -> None:
    """Issue 86: an operator reserves row 0 for bob: alice's whole-grid job waits, saying
    so, her 2-rank job runs beside it, bob's 4-rank job runs on the reserved nodes; the
    reservation taken back, alice's starts. A holder that is no user or role is refused."""
    end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() + 3600))
    r = arb.cli("ops", "maintenance", "add", "n0-0", "n0-1", "--for", "user:bob", "--reason",
                "bob's sweep", "--end", end)
    assert r.returncode == 0 and "reservation for user:bob 1: n0-0, n0-1 until" in r.stdout, \
        r.stdout + r.stderr
    st = arb.call("eve", "GET", "/status").json()
    assert st["nodes"]["n0-0"] == {"state": "reserved",
                                   "why": "reserved for user:bob by ops: bob's sweep"}
    assert "reservation for user:bob 1: n0-0, n0-1 from" in arb.cli("eve", "status").stdout
    whole = arb.submit("alice", "whole", 5, ranks=4)
    j = _until("alice's job waiting", lambda: (x := _job(arb, "alice", whole))["reason"]
               and x)
    assert j["state"] == "queued" and j["reason"].startswith(
        "maintenance or a reservation for others"), j
    pair = arb.submit("alice", "pair", 5, ranks=2)
    assert json.loads(arb.wait("alice", pair).stdout)["state"] == "finished"
    bobs = arb.submit("bob", "bobs", 5, ranks=4)
    done = json.loads(arb.wait("bob", bobs).stdout)  # (the whole grid: row 0 is his)
    assert done["state"] == "finished" and done["result"]["nodes"] == 4, done
    assert _job(arb, "alice", whole)["state"] == "queued"
    assert arb.call("ops", "DELETE", "/maintenance/1").status_code == 200
    assert json.loads(arb.wait("alice", whole).stdout)["state"] == "finished"
    later = {"nodes": ["n1-1"], "start": time.time(), "end": time.time() + 60, "reason": "x"}
    for bad in ("user:nobody", "role:wizard", "bob", 7):
        r2 = arb.call("ops", "POST", "/maintenance", json={**later, "for": bad})
        assert r2.status_code == 422 and "for:" in r2.text, (bad, r2.text)


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_job_array_queues_runs_and_is_cancelled_as_one_and_apart(
        arb: Arbiter, tmp_path: Path) -> None:
    """Issue 86: `oddl submit --array 0-3` is four jobs j1_0 .. j1_3, each the experiment
    with seed = N, listed and cancelled apart (j1_3), waited for as one (j1: cancelled,
    its task was); `oddl cancel ID` cancels every task left; a spec that is no array, or
    too big, is refused and nothing is queued."""
    from tests.test_arbiter import JOB

    exp = tmp_path / "sweep.toml"
    exp.write_text(JOB.format(name="sweep", iterations=100, ranks=2))
    for bad in ("0-", "5-2", "0-999", "1,1", "0-3:0", "x"):
        r = arb.cli("alice", "submit", str(exp), "--array", bad)
        assert r.returncode == 2 and "array:" in r.stderr, (bad, r.stderr)
    assert arb.call("alice", "GET", "/jobs").json()["jobs"] == []
    r = arb.cli("alice", "submit", str(exp), "--array", "0-3")
    assert r.returncode == 0 and r.stdout.startswith(
        "j1: 4 tasks queued (j1_0 .. j1_3; 2 ranks, 100 iterations each)"), r.stdout + r.stderr
    assert arb.cli("alice", "cancel", "j1_3").returncode == 0
    listed = [j["job"] for j in arb.call("eve", "GET", "/jobs").json()["jobs"]]
    assert listed == ["j1_0", "j1_1", "j1_2", "j1_3"]
    done = arb.wait("alice", "j1")
    one = json.loads(done.stdout)
    assert done.returncode == 1 and one["state"] == "cancelled" and one["array"], one
    assert [t["state"] for t in one["tasks"]] == ["finished"] * 3 + ["cancelled"]
    for n in range(4):
        assert f"seed = {n}" in (arb.state / "runs" / f"j1_{n}" / "experiment.toml"
                                 ).read_text()
    assert arb.call("bob", "DELETE", "/jobs/j1").status_code == 403  # alice's
    long = tmp_path / "long.toml"
    long.write_text(JOB.format(name="long", iterations=100000, ranks=2))
    r = arb.cli("alice", "submit", str(long), "--array", "7,9", "--json")
    base = json.loads(r.stdout)["array"]
    gone = arb.call("alice", "DELETE", f"/jobs/{base}").json()
    assert gone["tasks"] == [f"{base}_7", f"{base}_9"]
    assert json.loads(arb.wait("alice", base).stdout)["state"] == "cancelled"


def test_an_arrays_tasks_take_their_places_in_the_order_of_submission(tmp_path: Path) -> None:
    """Reproducer (the lab day, issue 86): a task's place was read from its id, and
    int("9_0") is 90 in Python: after the array j9_0..j9_3 the next job was j94, and an
    array j2_0 would have taken j20's place (a UNIQUE failure, a 500)."""
    from oddl.app.ledger import Ledger
    from oddl.controller.service.jobs import JobRequest

    ledger = Ledger(tmp_path / "a.sqlite")
    ledger.begin(1)
    for _ in range(2):
        ledger.add("alice", JobRequest(ledger.next_id(), "resnet50", "ring", 2, 10, 1, 0,
                                       "any", 1))
    base = ledger.next_id()
    for t in range(4):
        ledger.add("bob", JobRequest(f"{base}_{t}", "resnet50", "ring", 2, 10, 1, 0, "any", 1))
    assert (base, ledger.next_id()) == ("j3", "j7")
    ledger.add("alice", JobRequest("j7", "resnet50", "ring", 2, 10, 1, 0, "any", 1))
    assert [j["job"] for j in ledger.jobs()] == ["j1", "j2", "j3_0", "j3_1", "j3_2", "j3_3",
                                                 "j7"]


def test_usage_charges_the_time_nodes_were_held_not_the_arbiters_downtime(
        tmp_path: Path) -> None:
    """Reproducer (issue 64): `oddl usage` charged nodes x (end - first start), the time no
    arbiter ran included (43.4 s charged for 12.3 s held); `--since` selected by
    submission."""
    from oddl.app.ledger import Ledger
    from oddl.controller.service.jobs import JobRequest

    ledger = Ledger(tmp_path / "a.sqlite")
    ledger.begin(1)
    ledger.add("alice", JobRequest("j1", "resnet50", "ring", 2, 10, 1, 0, "any", 1))
    ledger.holding("j1", 2)
    ledger.close()  # killed while j1 held 2 nodes
    db = Ledger(tmp_path / "a.sqlite")
    db.db.execute("UPDATE holds SET start = 1000")
    db.db.execute("UPDATE lives SET started = 990, seen = 1010")  # last seen 10 s in
    db.db.execute("UPDATE jobs SET submitted = 900")
    db.db.commit()
    db.begin(2)  # 1010 .. now: no arbiter; j1 held nothing
    db.db.execute("INSERT INTO holds VALUES ('j1', 2, 5000, 5005)")  # held again, 5 s
    db.db.commit()
    u = db.usage(0)["alice"]
    assert u["node_hours"] == pytest.approx(2 * (10 + 5) / 3600, abs=1e-6)
    assert u["per_job"]["j1"]["node_hours"] == pytest.approx(2 * 15 / 3600, abs=1e-6)
    # a window: the part within, by when the nodes were held (not by submission)
    assert db.usage(1005, 5002)["alice"]["node_hours"] == pytest.approx(2 * (5 + 2) / 3600,
                                                                        abs=1e-6)
    assert db.usage(6000, 7000) == {}
    db.close()


def test_an_empty_or_damaged_ledger_is_refused_never_started_afresh(tmp_path: Path) -> None:
    """Reproducer (issue 64): a 0-byte ledger started as an empty one, its history lost
    without a word."""
    from oddl.app.ledger import Ledger
    from oddl.app.stores import StoreError

    empty = tmp_path / "empty.sqlite"
    empty.touch()
    with pytest.raises(StoreError, match=r"an empty file \(0 bytes\), not an arbiter's ledger"):
        Ledger(empty)
    assert empty.stat().st_size == 0  # left as found
    good = tmp_path / "good.sqlite"
    Ledger(good).close()
    assert not list(tmp_path.glob(".*.new"))  # a new ledger is made whole, then moved in
    whole = good.read_bytes()
    for page in range(1, len(whole) // 4096):  # any page scribbled on: refused, in a line
        data = bytearray(whole)
        data[page * 4096: page * 4096 + 400] = b"\xff" * 400
        good.write_bytes(bytes(data))
        with pytest.raises(StoreError, match=r"damaged|not an arbiter's ledger") as e:
            Ledger(good)
        assert "\n" not in str(e.value) and "move it aside" in str(e.value)


def test_a_submission_names_no_file_of_the_arbiters_host(tmp_path: Path) -> None:
    """Reproducer (issue 64): a submission naming `jobs_trace` told its user whether a path
    on the arbiter's host existed (and what its first line said)."""
    from oddl.app.submission import Refused, job_request
    from oddl.controller.base.topology import Grid

    tb = make_testbed(2, 2)
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    job = JOB.format(name="x", iterations=5, ranks=2)
    for text in (f'jobs_trace = "{secret}"\n' + job, 'jobs_trace = "/etc/passwd"\n' + job,
                 job + '[[jobs]]\nname = "x"\nmodel = "resnet50"\n'):
        with pytest.raises(Refused) as e:
            job_request(text, Grid.from_testbed(tb), tb, "j1", 0)
        assert e.value.status == 422
        assert "the arbiter reads no file a job names" in str(e.value)
        assert "hunter2" not in str(e.value) and "not found" not in str(e.value)
