"""`oddl arbiter` for a lab's operators (issue 64): the lab day's defects, and what a Slurm
admin expects to see and do (jobs with why they wait, status, drain, dependencies, fair
share, users at run time), on an emulator of its own."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
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


@pytest.fixture
def arb(root: Path, emu: Path, tmp_path: Path) -> Iterator[Arbiter]:
    a = Arbiter(root, emu, tmp_path / "state", 0)
    try:
        yield a
    finally:
        a.stop()


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



@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_requeued_job_goes_on_from_its_recorded_iterations(arb: Arbiter) -> None:
    """Issue 86: `oddl requeue ID`. A running job is stopped and queued again, a cancelled
    one too; each goes on from its first iteration not recorded, records every iteration
    once, and its log says who queued it again. Another user's job, a finished job and a
    queued one are refused."""
    job = arb.submit("alice", "long", 40, ranks=4)
    arb.until_done("alice", job, 3)
    r = arb.cli("bob", "requeue", job)
    assert r.returncode == 2 and "not bob's" in r.stderr, (r.stdout, r.stderr)
    r = arb.cli("alice", "requeue", job)
    assert r.returncode == 0 and f"{job} queued again" in r.stdout, r.stderr
    done = json.loads(arb.wait("alice", job).stdout)
    assert (done["state"], done["iterations_done"]) == ("finished", 40), done["why"]
    its = [i for i, *_ in arb.call("alice", "GET", f"/jobs/{job}/iterations").json()[
        "iterations"]]
    assert its == list(range(40))  # none twice, none lost
    said = [line for line in arb.call("alice", "GET", f"/jobs/{job}/logs").json()["log"]
            if "requeued by alice" in line]
    assert len(said) == 1 and "queued again from iteration" in said[0], said
    assert arb.call("alice", "POST", f"/jobs/{job}/requeue").status_code == 409  # finished
    # a cancelled job, queued again by an operator
    other = arb.submit("bob", "other", 300, ranks=2)  # (cancelled long before its end)
    arb.until_done("bob", other, 2)
    arb.cli("bob", "cancel", other)
    assert arb.ended("bob", other)["state"] == "cancelled"
    kept = arb.call("bob", "GET", f"/jobs/{other}").json()["iterations_done"]
    r = arb.call("ops", "POST", f"/jobs/{other}/requeue")
    assert r.status_code == 200 and r.json()["from_iteration"] == kept, r.text
    assert arb.call("ops", "POST", f"/jobs/{other}/requeue").status_code == 409  # queued
    done = json.loads(arb.wait("bob", other).stdout)
    assert (done["state"], done["iterations_done"]) == ("finished", 300), done
    assert not any("Traceback" in e for e in arb.err)


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_an_operators_job_preempts_a_users_and_the_user_goes_on(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Issue 86: `[roles.operator] preempt = true` was refused as an unknown key, and an
    urgent job waited for the whole queue ahead of it. Now the operator's job stops the
    user's running job, which holds the grid, and starts; the user's is queued again and
    goes on from its recorded iterations, none twice. A job never stops one of its own
    class: the operator's second job waits for the first."""
    limits = tmp_path / "limits.toml"
    limits.write_text("[roles.operator]\npreempt = true\n")
    arb = Arbiter(root, emu, tmp_path / "state", 0, "--limits", str(limits))
    try:
        long = arb.submit("alice", "long", 60, ranks=4)
        arb.until_done("alice", long, 3)
        urgent = arb.submit("ops", "urgent", 100, ranks=2)
        second = arb.submit("ops", "second", 5, ranks=4)  # needs the grid: waits for urgent
        # while urgent runs, the user's job waits, and says why
        j = _until("the preempted job queued", lambda: (
            j if (j := _job(arb, "alice", long))["state"] == "queued" else None))
        assert j["reason"].startswith(f"preempted by {urgent}"), j
        assert json.loads(arb.wait("ops", urgent).stdout)["state"] == "finished"
        logs = arb.call("alice", "GET", f"/jobs/{long}/logs").json()["log"]
        assert any(f"preempted by {urgent} (ops, operator)" in line for line in logs), logs
        assert any(f"preempts {long}" in line
                   for line in arb.call("ops", "GET", f"/jobs/{urgent}/logs").json()["log"])
        assert not any("preempted" in line
                       for line in arb.call("ops", "GET", f"/jobs/{second}/logs").json()["log"])
        done = json.loads(arb.wait("alice", long).stdout)
        assert (done["state"], done["iterations_done"]) == ("finished", 60), done["why"]
        its = [i for i, *_ in arb.call("alice", "GET", f"/jobs/{long}/iterations").json()[
            "iterations"]]
        assert its == list(range(60))
        assert json.loads(arb.wait("ops", second).stdout)["state"] == "finished"
        assert not any("Traceback" in e for e in arb.err)
    finally:
        arb.stop()


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_job_placed_before_its_first_iteration_says_it_is_starting(arb: Arbiter) -> None:
    """Issue 86's lab day: a job placed but not yet at its first iteration showed as
    `queued` with no reason (36 of 1,788 polls). Its first iteration's compute here lasts
    1.5 s: every poll until it runs gives a reason, and that one says `starting`."""
    slow = JOB.format(name="slow", iterations=2, ranks=2).replace(
        "compute_time_ms = 10.0", "compute_time_ms = 1500.0")
    r = arb.call("alice", "POST", "/jobs", json={"experiment": slow})
    assert r.status_code == 201, r.text
    job = r.json()["job"]
    seen = []
    t_end = time.monotonic() + 60
    while (j := _job(arb, "alice", job))["state"] == "queued":
        assert time.monotonic() < t_end, seen[-3:]
        seen.append(j.get("reason"))
        time.sleep(0.05)
    assert seen and all(seen), seen  # none without a reason
    assert any(r.startswith("starting (placed") for r in seen), seen


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_jobs_time_limit_is_changed_queued_or_running_within_the_caps(
        arb: Arbiter) -> None:
    """Issue 86: `oddl update ID --time-limit S`. A running job's limit shortened to less
    than it has run ends it now, `timeout`; a queued job's lengthened takes effect when it
    starts; past the arbiter's most (a day by default), or on another user's job, refused;
    the ledger keeps the new limit and the log who set it."""
    long = arb.submit("alice", "long", 1_000_000, ranks=4)
    arb.until_done("alice", long, 2)
    queued = arb.submit("bob", "next", 5, ranks=4)
    r = arb.cli("bob", "update", queued, "--time-limit", "900")
    assert r.returncode == 0 and f"{queued}: time limit 900 s" in r.stdout, r.stderr
    assert _job(arb, "bob", queued)["time_limit_s"] == 900
    r = arb.cli("bob", "update", long, "--time-limit", "60")
    assert r.returncode == 2 and "not bob's" in r.stderr, r.stderr
    r = arb.cli("alice", "update", long, "--time-limit", "1e6")
    assert r.returncode == 2 and "max_time_limit_s" in r.stderr, r.stderr
    r = arb.cli("alice", "update", long, "--time-limit", "0.001")
    assert r.returncode == 0, r.stderr
    j = arb.ended("alice", long)
    assert (j["state"], j["why"]) == ("timeout", "its time limit of 0.001 s was reached"), j
    assert any("time limit 3600 s -> 0.001 s by alice" in line
               for line in arb.call("alice", "GET", f"/jobs/{long}/logs").json()["log"])
    done = json.loads(arb.wait("bob", queued).stdout)
    assert (done["state"], done["time_limit_s"]) == ("finished", 900), done
    assert arb.call("bob", "PUT", f"/jobs/{queued}/time_limit",
                    json={"time_limit_s": 60}).status_code == 409  # finished


@pytest.mark.realtime  # an emulator, an arbiter, a broker: the wall clock
def test_every_jobs_end_is_kept_on_the_bus_under_its_own_topic_for_a_while(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Issue 86: only the latest end was retained, so a watcher that was down missed the
    others. Each job's end is retained under `.../ended/JOB`: a subscriber that comes
    after both jobs ended hears both; `[notices] keep_s` later the arbiter clears them
    (the subscriber hears each cleared), and a later subscriber hears neither. (The
    module's emulator served other arbiters, whose ends it may still keep.)"""
    limits = tmp_path / "limits.toml"
    limits.write_text("[notices]\nkeep_s = 6\n")
    arb = Arbiter(root, emu, tmp_path / "state", 0, "--limits", str(limits))
    try:
        t0 = time.time()
        jobs = [arb.submit("alice", f"n{k}", 2, ranks=2) for k in range(2)]
        for j in jobs:
            assert arb.ended("alice", j)["state"] == "finished"
        prefix, listen = _ends_on_the_bus(emu)

        def ours(got: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
            """(job, payload) of this arbiter's jobs: cleared, or ended since t0."""
            return [(j, p) for t, p in got if (j := t.rsplit("/", 1)[1]) in jobs
                    and t != prefix and (not p or json.loads(p)["ended"] >= t0)]

        # a subscriber after both ended: each job's end, kept; then, still listening, each
        # cleared (an empty message on its topic)
        said = ours(listen(lambda g: [p for _j, p in ours(g)].count(b"") == 2))
        assert sorted(j for j, p in said if p) == sorted(jobs), said
        assert all(json.loads(p)["state"] == "finished" for _j, p in said if p)
        assert [j for j, p in said if not p] == jobs  # in the order they ended
        assert all(said.index((j, b"")) > [k for k, _ in said].index(j) for j in jobs)
        # a subscriber now: the latest end (retained), and neither of ours
        got = listen(lambda g: any(t == prefix for t, _ in g))
        assert [j for j, p in ours(got) if p] == [], got
    finally:
        arb.stop()


def _ends_on_the_bus(emu: Path) -> tuple[str, Callable[[Any], list[tuple[str, bytes]]]]:
    """The topic of the latest end, and a listener (as the dashboard) to it and to every
    job's, until `until(messages so far)` (30 s at most)."""
    import asyncio

    from oddl.app import registry
    from oddl.controller.base.config import load_testbed

    tb = load_testbed(emu)
    prefix = f"oddl/{tb.name}/telemetry/oddl-ctl/ended"

    async def listen(until: Any) -> list[tuple[str, bytes]]:
        got: list[tuple[str, bytes]] = []
        bus = registry.open_watch(tb)
        bus.on(prefix + "/#", lambda t, p: got.append((t, p)))  # (the latest's topic too)
        await bus.start()
        try:
            async with asyncio.timeout(30):
                while not until(got):
                    await asyncio.sleep(0.05)
        finally:
            await bus.close()
        return got

    return prefix, lambda until: asyncio.run(listen(until))


@pytest.mark.realtime  # an emulator, two arbiters, a broker: the wall clock
def test_an_end_kept_by_a_killed_arbiter_is_cleared_by_the_next(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """The arbiter clears each kept end itself (MQTT 3.1.1 has no expiry); one killed
    before it did leaves the end retained, and the next arbiter on its state clears it
    when it has been kept `keep_s` and it is on the bus (from its first job)."""
    import signal

    limits = tmp_path / "limits.toml"
    limits.write_text("[notices]\nkeep_s = 6\n")
    first = Arbiter(root, emu, tmp_path / "state", 0, "--limits", str(limits))
    t0 = time.time()
    try:
        job = first.submit("alice", "n", 2, ranks=2)
        assert first.ended("alice", job)["state"] == "finished"
    finally:
        first.stop(signal.SIGKILL)
    import threading

    prefix, listen = _ends_on_the_bus(emu)
    got: list[tuple[str, bytes]] = []  # (listening from before the next arbiter starts)
    heard = threading.Thread(target=lambda: got.extend(listen(
        lambda g: (f"{prefix}/{job}", b"") in g)))
    heard.start()
    second = Arbiter(root, emu, tmp_path / "state", 0, "--limits", str(limits))
    try:
        assert second.ended("alice", second.submit("alice", "m", 2, ranks=2))["state"] == \
            "finished"
        heard.join(60)
        assert (f"{prefix}/{job}", b"") in got, got
        kept = next(p for t, p in got if t == f"{prefix}/{job}")  # kept, then cleared
        assert kept and json.loads(kept)["ended"] >= t0, got
    finally:
        second.stop()


@pytest.mark.realtime  # an emulator, an arbiter, a drill by hand: the wall clock
def test_a_job_stopped_for_a_fault_says_so_and_goes_on(arb: Arbiter, emu: Path) -> None:
    """Issue 86's lab day: a job stopped for a fault showed as `running` on its old
    partition, with no reason, while it waited. A board dies under it (the emulator's
    control endpoint, as an operator drills): `oddl jobs` says it was stopped and what it
    waits for; the board comes back and the job goes on to its end, every iteration once."""
    import tomllib

    import httpx

    cfg = tomllib.loads(emu.read_text())["emulator"]
    auth = {"authorization": f"Bearer {Path(cfg['token_file']).read_text().strip()}"}
    job = arb.submit("alice", "long", 300, ranks=4)
    arb.until_done("alice", job, 3)
    with httpx.Client(base_url=cfg["control"], timeout=10) as c:
        r = c.post("/faults", headers=auth, content=json.dumps(
            {"kind": "dead-board", "target": "n0-0", "duration_ms": 4000}))
        assert r.status_code == 201, r.text
    j = _until("the stopped job's reason", lambda: (
        j if (j := _job(arb, "alice", job)).get("reason", "").startswith(
            "stopped for a fault") else None))
    assert j["state"] == "running", j  # (the ledger's: it has not ended)
    shown = arb.cli("alice", "jobs").stdout
    assert "stopped for a fault, to go on" in shown, shown
    done = json.loads(arb.wait("alice", job).stdout)
    assert (done["state"], done["iterations_done"]) == ("finished", 300), done["why"]
    its = [i for i, *_ in arb.call("alice", "GET", f"/jobs/{job}/iterations").json()[
        "iterations"]]
    assert its == list(range(300))


@pytest.mark.realtime  # an emulator, an arbiter, an HTTP server of the test's: wall clock
def test_a_jobs_webhook_is_told_its_end_within_the_allowed_addresses(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Issue 86: the per-job webhook. A job's end is POSTed to the URL it names, under an
    address the operator allows; a first answer of 503 is tried again; a redirect is not
    followed (its target hears nothing); an address not allowed, or with `..`, is refused
    at submission (422) and nothing is queued."""
    import http.server
    import threading

    heard: list[tuple[str, bytes]] = []
    tries: dict[str, int] = {}

    class Hooks(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            tries[self.path] = tries.get(self.path, 0) + 1
            if self.path == "/hooks/flaky" and tries[self.path] == 1:
                self.send_response(503)
            elif self.path == "/hooks/moved":
                self.send_response(302)
                self.send_header("location", "/hooks/target")
            else:
                heard.append((self.path, body))
                self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    limits = tmp_path / "limits.toml"
    limits.write_text(f'[notices]\nallow = ["{base}/hooks/"]\nretries = 2\ntimeout_s = 5\n')
    arb = Arbiter(root, emu, tmp_path / "state", 0, "--limits", str(limits))
    exp = tmp_path / "job.toml"
    exp.write_text(JOB.format(name="hooked", iterations=3, ranks=2))
    try:
        for bad in (f"{base}/other", f"{base}/hooks/../other", "http://10.0.0.1/hooks/",
                    "file:///etc/passwd"):
            r = arb.cli("alice", "submit", str(exp), "--webhook", bad)
            assert r.returncode == 2 and "webhook:" in r.stderr, (bad, r.stderr)
        assert arb.call("alice", "GET", "/jobs").json()["jobs"] == []  # nothing queued
        jobs = {}
        for hook in ("ok", "flaky", "moved"):
            r = arb.cli("alice", "submit", str(exp), "--webhook", f"{base}/hooks/{hook}",
                        "--json")
            assert r.returncode == 0, r.stderr
            jobs[hook] = json.loads(r.stdout)["job"]
        for j in jobs.values():
            assert arb.ended("alice", j)["state"] == "finished"
        _until("the webhooks told", lambda: {p for p, _b in heard} >= {"/hooks/ok",
                                                                        "/hooks/flaky"})
        for path, body in heard:
            note = json.loads(body)
            assert note["job"] == jobs[path.rsplit("/", 1)[1]] and note["state"] == "finished"
        assert tries["/hooks/flaky"] == 2  # a 503, then told
        logs = _until("the redirect said", lambda: [
            line for line in arb.call("alice", "GET", f"/jobs/{jobs['moved']}/logs").json()[
                "log"] if "webhook" in line])
        assert "answered 302: a redirect is not followed" in logs[0], logs
        assert "/hooks/target" not in tries and tries["/hooks/moved"] == 1
    finally:
        arb.stop()
        server.shutdown()


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_a_singleton_job_starts_after_every_earlier_job_of_its_name(
        arb: Arbiter, tmp_path: Path) -> None:
    """Issue 86: `oddl submit --singleton` (Slurm's). Two jobs of alice's named "sweep":
    the second, a singleton, waits for the first though nodes are free, and says why; a
    singleton of another name, or of another user, does not wait."""
    long, sweep = tmp_path / "long.toml", tmp_path / "sweep.toml"  # both named "sweep"
    long.write_text(JOB.format(name="sweep", iterations=1_000_000, ranks=2))
    sweep.write_text(JOB.format(name="sweep", iterations=3, ranks=2))
    other = tmp_path / "other.toml"
    other.write_text(JOB.format(name="other", iterations=3, ranks=2))

    def submit(user: str, exp: Path, *flags: str) -> str:
        r = arb.cli(user, "submit", str(exp), "--json", *flags)
        assert r.returncode == 0, r.stderr
        return str(json.loads(r.stdout)["job"])

    first = submit("alice", long)
    arb.until_done("alice", first, 2)
    second = submit("alice", sweep, "--singleton")
    j = _job(arb, "alice", second)
    assert (j["state"], j["reason"]) == (
        "queued", f"singleton: {first} of the same name comes first"), j
    # another name, or another user's job of the same name: they run beside it
    assert json.loads(arb.wait("alice", submit("alice", other, "--singleton")).stdout)[
        "state"] == "finished"
    assert json.loads(arb.wait("bob", submit("bob", sweep, "--singleton")).stdout)[
        "state"] == "finished"
    assert _job(arb, "alice", second)["state"] == "queued"
    arb.cli("alice", "cancel", first)
    assert json.loads(arb.wait("alice", second).stdout)["state"] == "finished"
    assert arb.call("alice", "POST", "/jobs", json={
        "experiment": sweep.read_text(), "singleton": "yes"}).status_code == 422


@pytest.mark.realtime  # an emulator, an arbiter, drills by hand: the wall clock
def test_a_job_stopped_too_often_is_held_with_its_iterations_not_failed(
        arb: Arbiter, emu: Path) -> None:
    """Issue 86: a job faults stopped more often than MAX_STOPS (3) failed, its iterations
    kept in the ledger but nothing going on from them. It is queued again, held, with the
    reason; an operator's release and it finishes, every iteration recorded once."""
    import tomllib

    import httpx

    cfg = tomllib.loads(emu.read_text())["emulator"]
    auth = {"authorization": f"Bearer {Path(cfg['token_file']).read_text().strip()}"}
    job = arb.submit("alice", "unlucky", 400, ranks=4)
    for k in range(4):  # each stop: n0-0 dead for 1.5 s, found, and the job goes on
        least = 2 * (k + 1)
        _until("the job running again", lambda least=least: (
            j if (j := _job(arb, "alice", job))["state"] == "running" and not j.get(
                "reason") and j["iterations_done"] >= least else None))
        with httpx.Client(base_url=cfg["control"], timeout=10) as c:
            r = c.post("/faults", headers=auth, content=json.dumps(
                {"kind": "dead-board", "target": "n0-0", "duration_ms": 1500}))
            assert r.status_code == 201, r.text
        _until("the stop", lambda: _job(arb, "alice", job).get("reason") or
               _job(arb, "alice", job)["state"] != "running")
    j = _until("the job held", lambda: (
        j if (j := _job(arb, "alice", job))["state"] == "queued" and j["held"] else None))
    assert j["reason"] == "held", j
    logs = arb.call("alice", "GET", f"/jobs/{job}/logs").json()["log"]
    assert any("stopped for faults 4 times" in line and "held for an operator" in line
               for line in logs), logs
    assert arb.cli("ops", "release", job).returncode == 0
    done = json.loads(arb.wait("alice", job).stdout)
    assert (done["state"], done["iterations_done"]) == ("finished", 400), done["why"]
    its = [i for i, *_ in arb.call("alice", "GET", f"/jobs/{job}/iterations").json()[
        "iterations"]]
    assert its == list(range(400))
