"""`oddl arbiter`, a job's life beyond submit and cancel (issue 86): requeue, preemption,
new time limits, singleton, and what `oddl jobs` says of a job starting or stopped; on an
emulator of its own (a module of its own: the suite runs it beside test_arbiter_ops and
test_arbiter_notices)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.test_arbiter import JOB, Arbiter
from tests.test_arbiter_ops import _job, _until


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
