"""`oddl arbiter` telling of jobs' ends (issue 86): every end kept on the bus under its
own topic a while, cleared by the arbiter (also by the next, after a kill), and the
per-job webhooks within the addresses an operator allows; on an emulator of its own."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.test_arbiter import JOB, Arbiter
from tests.test_arbiter_ops import _until


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


@pytest.mark.realtime  # an emulator, an arbiter, an HTTP server of the test's: wall clock
def test_a_jobs_webhook_is_told_its_end_within_the_allowed_addresses(
        root: Path, emu: Path, tmp_path: Path) -> None:
    """Issue 86: the per-job webhook. A job's end is POSTed to the URL it names, under an
    address the operator allows; a first answer of 503 is tried again; a redirect is not
    followed (its target hears nothing); an address not allowed, or with `..`, is refused
    at submission (422) and nothing is queued. A user's standing webhook (`[notices.users]`)
    hears every end of theirs, and no other user's."""
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
    limits.write_text(f'[notices]\nallow = ["{base}/hooks/"]\nretries = 2\ntimeout_s = 5\n'
                      f'[notices.users]\nalice = "{base}/hooks/alice"\n')
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
        bobs = json.loads(arb.cli("bob", "submit", str(exp), "--json").stdout)["job"]
        for j in jobs.values():
            assert arb.ended("alice", j)["state"] == "finished"
        assert arb.ended("bob", bobs)["state"] == "finished"
        _until("the webhooks told", lambda: {p for p, _b in heard} >= {"/hooks/ok",
                                                                        "/hooks/flaky"}
               and sum(p == "/hooks/alice" for p, _b in heard) == 3)
        for path, body in heard:
            note = json.loads(body)
            if path == "/hooks/alice":  # her standing webhook: every end of hers, no other
                assert note["job"] in jobs.values() and note["user"] == "alice", note
                continue
            assert note["job"] == jobs[path.rsplit("/", 1)[1]] and note["state"] == "finished"
        assert tries["/hooks/flaky"] == 2  # a 503, then told
        logs = _until("the redirect said", lambda: [
            line for line in arb.call("alice", "GET", f"/jobs/{jobs['moved']}/logs").json()[
                "log"] if "/hooks/moved" in line])
        assert "answered 302: a redirect is not followed" in logs[0], logs
        assert "/hooks/target" not in tries and tries["/hooks/moved"] == 1
    finally:
        arb.stop()
        server.shutdown()


def test_a_standing_webhook_outside_the_allowed_addresses_is_refused_at_start(
        tmp_path: Path) -> None:
    from oddl.app.limits import load_limits
    from oddl.controller.base.config import ConfigError

    f = tmp_path / "limits.toml"
    f.write_text('[notices]\nallow = ["https://hooks.lab.example/oddl/"]\n'
                 '[notices.users]\nalice = "https://hooks.lab.example/oddl/alice"\n'
                 'carol = "https://elsewhere.example/x"\n')
    with pytest.raises(ConfigError) as e:
        load_limits(f)
    assert [i.path for i in e.value.issues] == ["notices.users.carol"]
    assert "is not under an address this arbiter may call" in e.value.issues[0].reason
