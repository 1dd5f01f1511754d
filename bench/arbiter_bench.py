"""The arbiter as a lab uses it, measured (issue 44): submit latency as the queue grows to
1,000 jobs; the API's latency while partitions are set up and released (2-node ones, and
a 64-node one on an 8 x 8 grid); jobs lost and iterations recorded twice over random
`kill -9`s with three users submitting.

    python bench/arbiter_bench.py [--queued 1000] [--kills 20] [--big 3]

Runs `oddl emulate` of a 2 x 2 grid (and of an 8 x 8 one) and `oddl arbiter` on it, as a
lab would (the emulator and the arbiter are the real programs; the clients speak HTTP).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers import emulated_grid  # noqa: E402
from tests.test_arbiter import JOB, Arbiter, free_port  # noqa: E402

LIMITS = "[roles.user]\nmax_queued_jobs = 100000\n"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def submit_latency(a: Arbiter, queued: int) -> None:
    """The grid held by one long job; then `queued` jobs of the whole grid submitted one
    after another: each submit's latency, by queue length."""
    hold = a.submit("alice", "hold", 1_000_000, ranks=4)
    a.until_done("alice", hold, 1)
    body = {"experiment": JOB.format(name="q", iterations=5, ranks=4)}
    lat: list[float] = []
    with httpx.Client(headers={"Authorization": f"Bearer {a.token('bob')}"}) as c:
        for _ in range(queued):
            t = time.perf_counter()
            r = c.post(a.url + "/jobs", json=body, timeout=60)
            lat.append(time.perf_counter() - t)
            assert r.status_code == 201, r.text
    for lo in range(0, queued, max(1, queued // 4)):
        part = lat[lo:lo + max(1, queued // 4)]
        print(f"submit with {lo:>5}-{lo + len(part) - 1:<5} queued: median "
              f"{statistics.median(part) * 1e3:7.1f} ms, p99 {pct(part, 99) * 1e3:7.1f} ms")
    a.call("ops", "DELETE", f"/jobs/{hold}")
    for j in a.call("ops", "GET", "/jobs").json()["jobs"]:
        if j["state"] in ("queued", "running"):
            a.call("ops", "DELETE", f"/jobs/{j['job']}")


@contextlib.contextmanager
def polling_status(a: Arbiter, during_set_up: bool = False) -> Iterator[list[float]]:
    """GET /status every 10 ms while in it: each answer's latency (`during_set_up`: only
    the answers that list a partition being set up, `setting_up`)."""
    lat: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {a.token('eve')}"}) as c:
            while not stop.is_set():
                t = time.perf_counter()
                r = c.get(a.url + "/status", timeout=60)
                if not during_set_up or r.json()["setting_up"]:
                    lat.append(time.perf_counter() - t)
                time.sleep(0.01)

    th = threading.Thread(target=poll)
    th.start()
    try:
        yield lat
    finally:
        stop.set()
        th.join()


def said(what: str, lat: list[float]) -> None:
    print(f"API while {what}: {len(lat)} requests, median {statistics.median(lat) * 1e3:.1f} "
          f"ms, p99 {pct(lat, 99) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms")


def api_while_setting_up(a: Arbiter, jobs: int) -> None:
    """The API while short jobs start and end one after another (each a partition set up
    and released)."""
    with polling_status(a) as lat:
        ids = [a.submit("alice" if k % 2 else "bob", f"s{k}", 3, ranks=2)
               for k in range(jobs)]
        for k, job in enumerate(ids):
            a.wait("alice" if k % 2 else "bob", job)
    said(f"{jobs} partitions were set up and released", lat)


def api_while_64_nodes_set_up(d: Path, runs: int) -> None:
    """The API while `runs` jobs of all 64 nodes of an 8 x 8 grid start and end one after
    another; counted are the answers that say a partition is being set up: requests made
    while its devices were written."""
    with emulated_grid(ROOT, d, rows=8, cols=8, limit_s=600) as emu:
        a = Arbiter(ROOT, emu, d / "state-64", 0)
        try:
            with polling_status(a, during_set_up=True) as lat:
                for k in range(runs):
                    a.wait("alice", a.submit("alice", f"all{k}", 2, ranks=64))
        finally:
            a.stop()
    said(f"{runs} partitions of 64 nodes were set up (answers during a set-up)", lat)


def kills(root: Path, emu: Path, state: Path, n: int, seed: int = 1) -> None:
    """Three users submit; the arbiter is killed (SIGKILL) at random `n` times and started
    again on the same state; at the end, every job must have finished, each iteration
    recorded once."""
    rnd = random.Random(seed)
    port = free_port()
    a = Arbiter(root, emu, state, port)
    want: dict[str, int] = {}
    users = ("alice", "bob", "ops")
    try:
        for k in range(n):
            for u in users:
                its = rnd.randint(5, 40)
                want[a.submit(u, f"k{k}{u}", its, ranks=rnd.choice([1, 2, 4]))] = its
            time.sleep(rnd.uniform(0.2, 2.0))
            a.stop(9)
            a = Arbiter(root, emu, state, port)
        for job in want:
            a.wait("ops", job)
    finally:
        a.stop()
    db = sqlite3.connect(state / "arbiter.sqlite")
    states = dict(db.execute("SELECT id, state FROM jobs").fetchall())
    lost = [j for j in want if states.get(j) != "finished"]
    twice = sum(c - 1 for (c,) in db.execute(
        "SELECT count(*) FROM iterations GROUP BY job, iteration HAVING count(*) > 1"))
    missing = sum(n - db.execute("SELECT count(DISTINCT iteration) FROM iterations WHERE "
                                 "job = ?", (j,)).fetchone()[0] for j, n in want.items())
    print(f"{n} kill -9s, {len(want)} jobs of 3 users: {len(lost)} not finished "
          f"{lost[:5]}, {twice} iterations recorded twice, {missing} missing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--setups", type=int, default=10)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--big", type=int, default=3, help="set-ups of a 64-node partition")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "limits.toml").write_text(LIMITS)
        with emulated_grid(ROOT, d, limit_s=600) as emu:
            a = Arbiter(ROOT, emu, d / "state", 0, "--limits", str(d / "limits.toml"))
            try:
                submit_latency(a, args.queued)
                api_while_setting_up(a, args.setups)
                js = a.call("eve", "GET", "/jobs").json()["jobs"]
                whys = collections.Counter(j["why"][:120] for j in js if j["state"] == "failed")
                print(json.dumps(a.call("eve", "GET", "/status").json()["jobs"]),
                      dict(whys.most_common(3)))
            finally:
                a.stop()
            kills(ROOT, emu, d / "kills", args.kills)
        if args.big:
            big = d / "big"
            big.mkdir()
            api_while_64_nodes_set_up(big, args.big)


if __name__ == "__main__":
    main()
