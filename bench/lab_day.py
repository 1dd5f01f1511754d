"""A lab day on the arbiter (issue 86), scripted: three users and an operator on an emulated
2 x 4 grid, jobs of 2 to 8 ranks over some minutes (some chained, some too short for
their work, some cancelled, one array), a drain, one node's program killed with kill -9 and
started again, the arbiter killed with kill -9 and started again, one preemption.
Afterwards it holds the ledger and the API to what a lab relies on, and prints it.

    python bench/lab_day.py [--minutes 8] [--jobs 45] [--seed 1] [--out DIR]

Only the installed `oddl` (a wheel will do) and this file: the emulator, the node program
and the arbiter are the real programs, the clients the CLI and HTTP. Checks: every
accepted job accounted for exactly once and ended; each job's iterations recorded once,
0 to its last without a gap; usage per user equal to the sum of the nodes its jobs held
(the ledger's holds) within 0.5%; the preemption recorded; and the seconds in which a
queued job, held by nothing, fitted in as many free nodes in service as it has ranks
(fragmentation can explain a few: they are listed). Exit 0 if the checks pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import tomli_w

USERS = ("alice", "bob", "carol")


def job_toml(name: str, iterations: int, ranks: int, compute: float, **_: Any) -> str:
    """A job's experiment: ResNet-50's ring on `ranks` nodes, `compute` ms a step."""
    return tomli_w.dumps({"name": name, "testbed": "-", "iterations": iterations,
                          "workload": {"model": "resnet50", "collective": "ring",
                                       "ranks": ranks, "epochs": 1, "dataset_samples": 1000,
                                       "batch_per_node": 32, "compute_time_ms": compute}})


def oddl(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oddl.app", *args], capture_output=True,
                          text=True, timeout=120, **kw)


def start(args: list[str], log: Path, ready: str, timeout_s: float = 180
          ) -> tuple[subprocess.Popen[str], str]:
    """A long-lived `oddl` program, its stdout to `log`, once it says `ready` (its line)."""
    out = log.open("w")
    p = subprocess.Popen([sys.executable, "-m", "oddl.app", *args], stdout=out,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith(ready):
                return p, line
        if p.poll() is not None:
            raise RuntimeError(f"{args[0]} ended: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    p.kill()
    raise RuntimeError(f"{args[0]} not ready in {timeout_s:.0f} s: {log.read_text()[-2000:]}")


class Lab:
    """The programs of the day and the clients' view of them."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.url = ""
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lives = 0
        self.extra: list[str] = []  # the jobs the day's events submitted

    def env(self, user: str) -> dict[str, str]:
        return os.environ | {"ODDL_ARBITER": self.url,
                             "ODDL_TOKEN_FILE": str(self.d / "state" / "tokens" / user)}

    def cli(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return oddl(*args, env=self.env(user))

    def api(self, user: str, method: str, path: str) -> Any:
        tok = (self.d / "state" / "tokens" / user).read_text().strip()
        r = httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {tok}"},
                          timeout=30)
        return r.json()

    def arbiter(self) -> None:
        self.lives += 1
        p, line = start(["arbiter", str(self.d / "emu.toml"), "--state", str(self.d / "state"),
                         *(a for u in (*USERS, "ops:operator", "eve:observer")
                           for a in ("--user", u)), "--limits", str(self.d / "limits.toml"),
                         "--port", "0"], self.d / f"arbiter-{self.lives}.log", "ready ")
        self.procs["arbiter"], self.url = p, line.split()[-1]

    def stop(self) -> None:
        for name in ("arbiter", "node", "emulator"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(60)
                if p.poll() is None:
                    p.kill()


def testbed(d: Path) -> Path:
    """A 2 x 4 grid, from the shipped grid-64's optics and control."""
    oddl("examples", str(d / "ex"))
    tb = (d / "ex" / "hw_configs" / "grid-64.toml").read_text()
    tb = tb.replace('name = "grid-64"', 'name = "lab-2x4"').replace(
        "rows = 8\ncols = 8", "rows = 2\ncols = 4")
    assert tomllib.loads(tb)["grid"] == {"rows": 2, "cols": 4}
    (d / "tb.toml").write_text(tb)
    return d / "tb.toml"


def plan(rng: random.Random, n: int, seconds: float) -> list[dict[str, Any]]:
    """The day's submissions: when, whose, how big, and what becomes of them."""
    out = []
    for k in range(n):
        iterations = rng.choice((20, 40, 80, 150))
        job = {"at": seconds * 0.8 * k / n, "user": rng.choice(USERS),
               "ranks": rng.choice((2, 2, 4, 4, 8)), "iterations": iterations,
               "compute": rng.choice((10, 20)), "name": f"d{k}", "args": []}
        r = rng.random()
        if r < 0.1:
            job["args"] += ["--time-limit", "2"]  # too short for its work
        elif r < 0.2 and k:
            job["after"] = True  # after its user's previous job
        elif r < 0.3:
            job["cancel_after"] = rng.uniform(1, 10)
        out.append(job)
    out[n // 2]["array"] = "0-3"
    out[n // 2]["ranks"] = 2
    return out


def watch(lab: Lab, stop: threading.Event, seen: list[dict[str, Any]]) -> None:
    """Once a second: the queue and the nodes, as the observer sees them."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            jobs = lab.api("eve", "GET", "/jobs")["jobs"]
            st = lab.api("eve", "GET", "/status")
            seen.append({"t": time.time(), "jobs": jobs, "nodes": st["nodes"]})
        stop.wait(1.0)


def idle_fits(seen: list[dict[str, Any]]) -> list[str]:
    """Seconds (5 in a row or more) in which a queued job held by nothing had as many
    free nodes in service as ranks."""
    runs: dict[str, int] = {}
    found = []
    for s in seen:
        free = sum(d["state"] == "free" and "also" not in d for d in s["nodes"].values())
        for j in s["jobs"]:
            why = j.get("reason", "")
            if j["state"] == "queued" and not j.get("held") and j["ranks"] <= free and \
                    (why.startswith("resources") or why == ""):
                runs[j["job"]] = runs.get(j["job"], 0) + 1
                if runs[j["job"]] == 5:
                    found.append(f"{j['job']} ({j['ranks']} ranks, {free} free: {why!r})")
            else:
                runs.pop(j["job"], None)
    return found


def day(lab: Lab, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    seconds = args.minutes * 60
    todo = plan(rng, args.jobs, seconds)
    accepted: list[str] = []
    last: dict[str, str] = {}
    events = [(0.25, "drain"), (0.35, "resume"), (0.4, "kill node"), (0.55, "kill arbiter"),
              (0.7, "preempt")]
    said: list[str] = []
    cancels: list[tuple[float, str, str]] = []
    t0 = time.monotonic()
    for job in todo:
        while time.monotonic() - t0 < job["at"]:
            now = (time.monotonic() - t0) / seconds
            while events and events[0][0] <= now:
                said.append(event(lab, events.pop(0)[1]))
            for c in [c for c in cancels if c[0] <= time.monotonic()]:
                cancels.remove(c)
                lab.cli(c[1], "cancel", c[2])
            time.sleep(0.2)
        f = lab.d / f"{job['name']}.toml"
        f.write_text(job_toml(**job))
        extra = list(job["args"])
        if job.get("after") and job["user"] in last:
            extra += ["--after", last[job["user"]]]
        if "array" in job:
            extra += ["--array", job["array"]]
        r = lab.cli(job["user"], "submit", str(f), "--json", *extra)
        if r.returncode != 0:
            said.append(f"submit of {job['name']} refused: {r.stderr.strip()[:200]}")
            continue
        got = json.loads(r.stdout)
        ids = [t["job"] for t in got["tasks"]] if "array" in got else [got["job"]]
        accepted += ids
        last[job["user"]] = ids[-1]
        if "cancel_after" in job:
            cancels.append((time.monotonic() + job["cancel_after"], job["user"], ids[0]))
    while events:
        said.append(event(lab, events.pop(0)[1]))
    for _, user, j in cancels:
        lab.cli(user, "cancel", j)
    deadline = time.monotonic() + args.drain_minutes * 60
    while time.monotonic() < deadline:
        states = {j["job"]: j["state"] for j in lab.api("eve", "GET", "/jobs")["jobs"]}
        if all(states.get(j) not in ("queued", "running") for j in accepted + lab.extra):
            break
        time.sleep(2)
    return {"accepted": accepted, "events": said, "wall_s": round(time.monotonic() - t0)}


def event(lab: Lab, what: str) -> str:
    if what == "drain":
        lab.cli("ops", "drain", "n0-0", "--reason", "fibre swap")
    elif what == "resume":
        lab.cli("ops", "resume", "n0-0")
    elif what == "kill node":
        lab.procs["node"].kill()
        lab.procs["node"].wait()
        time.sleep(3)
        lab.procs["node"], _ = start(["node", str(lab.d / "emu.toml"), "--node", "n1-3"],
                                     lab.d / "node-2.log", "node n1-3")
    elif what == "kill arbiter":
        lab.procs["arbiter"].kill()
        lab.procs["arbiter"].wait()
        time.sleep(2)
        lab.arbiter()
    elif what == "preempt":  # carol's long whole-grid job, running, then ops's urgent one
        f = lab.d / "long.toml"
        f.write_text(job_toml("long", 600, 8, 10))
        long = json.loads(lab.cli("carol", "submit", str(f), "--json", "--priority",
                                  "100").stdout)["job"]
        deadline = time.monotonic() + 120
        while lab.api("eve", "GET", f"/jobs/{long}")["state"] != "running":
            if time.monotonic() > deadline:
                return f"preempt: carol's {long} did not start within 120 s"
            time.sleep(0.5)
        f = lab.d / "urgent.toml"
        f.write_text(job_toml("urgent", 20, 8, 10))
        r = lab.cli("ops", "submit", str(f), "--json")
        job = json.loads(r.stdout)["job"] if r.returncode == 0 else r.stderr.strip()[:200]
        lab.extra += [long, job]
        return f"preempt: ops's urgent {job} beside carol's running {long} at " \
               f"{time.strftime('%H:%M:%S')}"
    return f"{what} at {time.strftime('%H:%M:%S')}"


def checks(lab: Lab, out: dict[str, Any], seen: list[dict[str, Any]]) -> dict[str, Any]:
    jobs = lab.api("ops", "GET", "/jobs")["jobs"]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        by_id.setdefault(j["job"], []).append(j)
    db = sqlite3.connect(lab.d / "state" / "arbiter.sqlite")
    gaps = []
    for j in jobs:
        its = [i for (i,) in db.execute("SELECT iteration FROM iterations WHERE job = ? "
                                        "ORDER BY iteration", (j["job"],))]
        if its != list(range(len(its))):
            gaps.append(j["job"])
        if j["state"] == "finished" and len(its) != j["iterations"]:
            gaps.append(f"{j['job']} finished with {len(its)} of {j['iterations']}")
    held: dict[str, float] = {}
    for user, nodes, start, end in db.execute(
            "SELECT jobs.user, holds.nodes, holds.start, holds.end FROM holds JOIN jobs ON "
            "jobs.id = holds.job WHERE holds.end IS NOT NULL"):
        held[user] = held.get(user, 0.0) + nodes * (end - start) / 3600
    usage = lab.api("ops", "GET", "/usage")["users"]
    off = {u: (usage.get(u, {}).get("node_hours", 0.0), round(h, 6)) for u, h in held.items()
           if abs(usage.get(u, {}).get("node_hours", 0.0) - h) > 0.005 * max(h, 1e-9)}
    logs = [line for j in jobs for line in lab.api("ops", "GET", f"/jobs/{j['job']}/logs")[
        "log"] if "preempted by" in line]
    states: dict[str, int] = {}
    for j in jobs:
        states[j["state"]] = states.get(j["state"], 0) + 1
    return {
        "accounted_once": all(len(by_id.get(j, [])) == 1
                              for j in out["accepted"] + lab.extra),
        "unaccounted": [j for j in out["accepted"] if j not in by_id],
        "not_ended": [j["job"] for j in jobs if j["state"] in ("queued", "running")],
        "iteration_gaps": gaps, "usage_off": off, "preemptions": len(logs),
        "states": states, "idle_while_fitting": idle_fits(seen)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--drain-minutes", type=float, default=10.0,
                    help="how long the jobs left may take to end after the last submission")
    ap.add_argument("--jobs", type=int, default=45)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    d = (args.out or Path(f"lab-day-{time.strftime('%Y%m%d-%H%M%S')}")).absolute()
    d.mkdir(parents=True, exist_ok=True)
    (d / "limits.toml").write_text("[roles.operator]\npreempt = true\n[roles.user]\n"
                                   "max_queued_jobs = 1000\n")
    lab = Lab(d)
    seen: list[dict[str, Any]] = []
    stop = threading.Event()
    try:
        lab.procs["emulator"], _ = start(["emulate", str(testbed(d)), "--out",
                                          str(d / "emu.toml"), "--external-node", "n1-3"],
                                         d / "emulator.log", "ready")
        lab.procs["node"], _ = start(["node", str(d / "emu.toml"), "--node", "n1-3"],
                                     d / "node-1.log", "node n1-3")
        lab.arbiter()
        threading.Thread(target=watch, args=(lab, stop, seen), daemon=True).start()
        out = day(lab, args)
        out |= checks(lab, out, seen)
    finally:
        stop.set()
        lab.stop()
    ok = out["accounted_once"] and not (out["unaccounted"] or out["not_ended"] or
                                        out["iteration_gaps"] or out["usage_off"]) \
        and out["preemptions"] >= 1
    out["ok"] = ok
    (d / "lab_day.json").write_text(json.dumps(out, indent=1))
    print(f"lab day in {d}: {len(out['accepted'])} jobs accepted in {out['wall_s']} s; "
          f"states {out['states']}")
    for e in out["events"]:
        print(f"  {e}")
    print(f"every accepted job accounted for once: {out['accounted_once']} "
          f"(unaccounted {out['unaccounted']}, not ended {out['not_ended']})")
    print(f"iterations recorded once, without gaps: {not out['iteration_gaps']} "
          f"{out['iteration_gaps'][:5]}")
    print(f"usage per user equal to its jobs' holds (0.5%): {not out['usage_off']} "
          f"{out['usage_off']}")
    print(f"preemptions recorded: {out['preemptions']}")
    print(f"queued jobs that fitted the free nodes for 5 s or more: "
          f"{len(out['idle_while_fitting'])} {out['idle_while_fitting'][:5]}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
