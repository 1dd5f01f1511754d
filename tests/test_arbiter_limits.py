"""`oddl arbiter`'s fairness (issue 44): limits, time limits, holds, priorities, usage and
tokens, on an emulator of its own (beside tests/test_arbiter.py and
tests/test_arbiter_restart.py, on another worker)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.test_arbiter import JOB, LIMITS, Arbiter


@pytest.mark.realtime  # an emulator, an arbiter, HTTP: the wall clock
def test_limits_time_limits_holds_priorities_usage_and_tokens(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Issue 44: no fairness (10,000,000 iterations at priority 1000 accepted, a flood all
    queued), no time limit, no hold, no accounting, tokens never rotated."""
    (tmp_path / "limits.toml").write_text(LIMITS)
    a = Arbiter(root, emu, tmp_path / "state", 0, "--limits", str(tmp_path / "limits.toml"))
    try:
        # a second arbiter on the same state is refused, naming the first
        second = subprocess.run(
            [sys.executable, "-m", "oddl.app", "arbiter", str(emu), "--state",
             str(tmp_path / "state"), "--user", "alice"], capture_output=True, text=True,
            timeout=60)
        assert second.returncode == 3, second.stderr
        assert "state directory 'arbiter' is in use by oddl arbiter (pid " in second.stderr
        # a time limit: the job ends `timeout`, and `wait` says so (exit 1); long enough
        # that it still holds alice's queue while her limits are tried below (at 1.5 s, a
        # loaded machine's three requests outlasted it, and her third job was let in)
        exp = tmp_path / "forever.toml"
        exp.write_text(JOB.format(name="forever", iterations=1_000_000, ranks=2))
        r = a.cli("alice", "submit", str(exp), "--time-limit", "8", "--json")
        assert r.returncode == 0, r.stderr
        forever = json.loads(r.stdout)
        assert forever["time_limit_s"] == 8
        # alice's running nodes are at her limit (2): her second job waits, bob's starts
        second_job = a.submit("alice", "next", 5)
        bobs = a.submit("bob", "bobs", 5)
        over = a.call("alice", "POST", "/jobs", json={"experiment": JOB.format(
            name="third", iterations=5, ranks=2)})
        assert over.status_code == 429 and "max_queued_jobs 2" in over.json()["error"]
        big = a.call("bob", "POST", "/jobs", json={"experiment": JOB.format(
            name="big", iterations=5, ranks=4)})
        assert big.status_code == 422 and "max_running_nodes" in big.json()["error"]
        assert a.ended("bob", bobs)["state"] == "finished"
        waited = a.wait("alice", forever["job"])
        assert waited.returncode == 1
        d = json.loads(waited.stdout)
        assert d["state"] == "timeout" and "time limit of 8 s" in d["why"], d
        assert a.ended("alice", second_job)["state"] == "finished"
        # an operator holds, reorders and releases a queued job
        filler = a.submit("bob", "filler", 400, ranks=2)
        held = a.submit("bob", "held", 5, ranks=2)
        a.until_done("bob", filler, 1)
        assert a.cli("ops", "hold", held).returncode == 0
        assert a.call("ops", "PUT", f"/jobs/{held}/priority", json={"priority": 7}
                      ).status_code == 200
        assert a.call("bob", "POST", f"/jobs/{held}/hold").status_code == 403
        j = a.call("bob", "GET", f"/jobs/{held}").json()
        assert (j["held"], j["priority"], j["state"]) == (True, 7, "queued")
        a.until_done("bob", filler, 10)  # a free row, and still it waits: held
        assert a.call("bob", "GET", f"/jobs/{held}").json()["state"] == "queued"
        assert a.call("ops", "POST", f"/jobs/{held}/release").status_code == 200
        assert a.ended("bob", held)["state"] == "finished"
        a.call("ops", "DELETE", f"/jobs/{filler}")
        # accounting, from the ledger
        u = json.loads(a.cli("ops", "usage", "--json").stdout)
        assert u["alice"]["states"] == {"finished": 1, "timeout": 1}
        assert u["bob"]["jobs"] == 3 and u["bob"]["node_hours"] > 0
        assert set(a.call("bob", "GET", "/usage").json()["users"]) == {"bob"}
        # a token rotated is refused at once; the new one works
        old = a.token("bob")
        assert a.cli("ops", "token", "bob").returncode == 0
        assert httpx.get(a.url + "/jobs", headers={"Authorization": f"Bearer {old}"}
                         ).status_code == 401
        assert a.call("bob", "GET", "/jobs").status_code == 200
        assert a.call("ops", "DELETE", "/tokens/bob").status_code == 200
        assert not (tmp_path / "state" / "tokens" / "bob").exists()
    finally:
        a.stop()


def test_limits_merge_field_by_field_user_over_role_over_built_in(tmp_path: Path) -> None:
    """Reproducer (issue 64): `Limits.rule()` was `users.get(user) or roles.get(role)`:
    `[users.carol] approval = true` left carol with priority up to 1000 and no queue cap,
    and a partial `[roles.user]` loosened the built-in ones."""
    from oddl.app.limits import load_limits

    f = tmp_path / "limits.toml"
    f.write_text("[users.carol]\napproval = true\n")
    carol = load_limits(f).rule("carol", "user")
    assert (carol.approval, carol.max_priority, carol.max_queued_jobs) == (True, 100, 100)
    f.write_text("[roles.user]\nmax_running_nodes = 32\n[users.alice]\nmax_priority = 10\n")
    lim = load_limits(f)
    bob, alice = lim.rule("bob", "user"), lim.rule("alice", "user")
    assert (bob.max_running_nodes, bob.max_priority, bob.max_queued_jobs) == (32, 100, 100)
    assert (alice.max_running_nodes, alice.max_priority) == (32, 10)
    ops = lim.rule("ops", "operator")  # an operator: none but the time limits
    assert (ops.max_priority, ops.max_queued_jobs, ops.max_running_nodes) == (1000, None, None)
