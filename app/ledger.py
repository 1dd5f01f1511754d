"""The arbiter service's durable state: every job submitted, its state, each iteration it
recorded, its log and its result, and each life of the arbiter, in SQLite (WAL; a commit
per change) under the service's state directory. A killed arbiter started again on the
same directory finds the queue as it was, and each running job's first iteration not
recorded; an iteration is recorded once (the key is the job and the iteration). What a
job's result says (iterations, their times, JCT, the arbiter's time down) is read from
here, never from one arbiter's memory.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sqlite3
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from oddl.app.orders import Orders
from oddl.app.stores import StoreError, open_store
from oddl.controller.service.jobs import JobRequest, percentile

SCHEMA_VERSION = 3  # PRAGMA user_version: a newer one is refused (app/stores.py)
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, seq INTEGER UNIQUE, user TEXT, state TEXT, request TEXT,
    submitted REAL, started REAL, ended REAL, partition TEXT, why TEXT, result TEXT);
CREATE TABLE IF NOT EXISTS iterations (
    job TEXT, iteration INTEGER, t_start_ns INTEGER, t_end_ns INTEGER,
    PRIMARY KEY (job, iteration));
CREATE TABLE IF NOT EXISTS log (job TEXT, t REAL, line TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS lives (pid INTEGER, started REAL, seen REAL);
CREATE TABLE IF NOT EXISTS holds (job TEXT, nodes INTEGER, start REAL, end REAL);
CREATE TABLE IF NOT EXISTS drains (node TEXT PRIMARY KEY, why TEXT, by TEXT, t REAL);
CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, role TEXT, by TEXT, t REAL);
CREATE TABLE IF NOT EXISTS maintenance (id INTEGER PRIMARY KEY, nodes TEXT, start REAL,
    end REAL, why TEXT, by TEXT);
CREATE INDEX IF NOT EXISTS holds_job ON holds (job);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, seq);
CREATE INDEX IF NOT EXISTS log_job ON log (job);
"""
ADDED = {"held": "INTEGER NOT NULL DEFAULT 0"}  # schema 2's columns of jobs
# a window's holder: "" maintenance, "user:NAME" or "role:ROLE" a reservation (issue 86)
ADDED_WINDOWS = {"holder": "TEXT NOT NULL DEFAULT ''"}
ACTIVE = ("queued", "running")
ENDED = ("finished", "failed", "cancelled", "timeout", "quarantined")
MAX_LOG = 1000  # lines kept per job


def _stamp(t: float) -> str:
    """A full local timestamp with its offset: 2026-11-26 01:17:16.426+0000."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + \
        f".{int(t % 1 * 1000):03d}" + time.strftime("%z", time.localtime(t))


class Ledger:
    def __init__(self, path: Path) -> None:
        if path.exists() and path.stat().st_size == 0 and not _has_wal(path):
            # (a new ledger is made whole before it is put in place: an empty file is
            # one whose history went, never one to start again on quietly)
            raise StoreError(f"{path}: an empty file (0 bytes), not an arbiter's ledger: "
                             f"its jobs' history is gone (copied short? the disk full?); "
                             f"restore it, or move it aside to start a new one")
        if not path.exists():
            _create(path)
        try:
            self.db = open_store(path, SCHEMA, SCHEMA_VERSION, "arbiter's ledger")
            damage = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if damage != "ok":
                self.db.close()
                said = " ".join(str(damage).replace("*** in database main ***", "").split())
                raise StoreError(f"{path}: a damaged arbiter's ledger (SQLite's "
                                 f"quick_check: {said[:200]}); restore it from a copy, or "
                                 f"move it aside (with its -wal and -shm files) to start a "
                                 f"new one")
            have = {r[1] for r in self.db.execute("PRAGMA table_info(jobs)")}
            for col, decl in ADDED.items():
                if col not in have:  # a schema 1 ledger: its jobs are none held
                    self.db.execute(f"ALTER TABLE jobs ADD COLUMN {col} {decl}")
            have = {r[1] for r in self.db.execute("PRAGMA table_info(maintenance)")}
            for col, decl in ADDED_WINDOWS.items():
                if col not in have:  # an earlier ledger's windows: every one maintenance
                    self.db.execute(f"ALTER TABLE maintenance ADD COLUMN {col} {decl}")
            if self.db.execute("SELECT 1 FROM meta WHERE key = 'holds'").fetchone() is None:
                # a schema 2 ledger kept no holds: each job's, as near as it tells (its
                # ranks, from its first start to its end)
                self.db.execute(
                    "INSERT INTO holds SELECT id, coalesce(json_extract(request, '$.ranks'), "
                    "0), started, ended FROM jobs WHERE started IS NOT NULL AND "
                    "json_valid(request)")
                self.db.execute("INSERT INTO meta VALUES ('holds', 'since schema 3')")
            self.db.commit()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{path}: not an arbiter's ledger ({e}); move it aside (with "
                             f"its -wal and -shm files) to start a new one") from None
        self.path = path
        self.runs = path.parent / "runs"  # each job's run directory (app/job_runs.py)
        self.life = 0.0  # when this arbiter's life began
        self.orders = Orders(self.db)  # drains, users, maintenance and reservations

    # --- the state directory's testbed and the arbiter's lives ----------------------------
    def testbed(self, name: str) -> str | None:
        """The testbed this state is for: recorded at its first start; the one recorded if
        it is another."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'testbed'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('testbed', ?)", (name,))
            self.db.commit()
            return None
        return None if row[0] == name else str(row[0])

    def begin(self, pid: int) -> float | None:
        """This arbiter's life begins: the seconds the last one has been gone (None: the
        first, or one that never ran)."""
        last = self.db.execute("SELECT seen FROM lives ORDER BY rowid DESC LIMIT 1"
                               ).fetchone()
        self.life = time.time()
        # what the last one's jobs held, they held until it was last seen alive
        self.db.execute("UPDATE holds SET end = ? WHERE end IS NULL",
                        (last[0] if last else self.life,))
        self.db.execute("INSERT INTO lives VALUES (?, ?, ?)", (pid, self.life, self.life))
        self.db.commit()
        return self.life - last[0] if last else None

    def alive(self) -> None:
        """This arbiter is alive now (its downtime, if it dies, counts from here)."""
        self.db.execute("UPDATE lives SET seen = ? WHERE rowid = (SELECT max(rowid) FROM "
                        "lives)", (time.time(),))
        self.db.commit()

    def down_s(self, since: float, until: float) -> float:
        """The seconds no arbiter ran between `since` and `until` (wall clock)."""
        lives = self.db.execute("SELECT started, seen FROM lives ORDER BY rowid").fetchall()
        return sum(max(0.0, min(float(b[0]), until) - max(float(a[1]), since))
                   for a, b in itertools.pairwise(lives))

    # --- jobs ---------------------------------------------------------------------------
    def next_id(self) -> str:
        """The next job's id: j1, j2, ..."""
        return f"j{(self.db.execute('SELECT max(seq) FROM jobs').fetchone()[0] or 0) + 1}"

    def add(self, user: str, req: JobRequest) -> None:
        """A new job (named by `next_id`), queued."""
        # (its place in submission order: an array's tasks, ID_N, take one each)
        self.db.execute("INSERT INTO jobs (id, seq, user, state, request, submitted) "
                        "VALUES (?, (SELECT coalesce(max(seq), 0) + 1 FROM jobs), ?, "
                        "'queued', ?, ?)",
                        (req.name, user, json.dumps(asdict(req)), time.time()))
        limit = f", time limit {req.time_limit_ns / 1e9:g} s" if req.time_limit_ns else ""
        self.note(req.name, f"queued by {user} ({req.ranks} ranks, {req.iterations} "
                            f"iterations, priority {req.priority}{limit})")

    def set(self, job: str, state: str, **fields: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE jobs SET state = ?{', ' + cols if cols else ''} WHERE id = ?",
                        (state, *fields.values(), job))
        self.db.commit()

    def request(self, job: str, req: JobRequest) -> None:
        """A queued job's request as changed (its priority)."""
        self.db.execute("UPDATE jobs SET request = ? WHERE id = ?",
                        (json.dumps(asdict(req)), job))
        self.db.commit()

    def hold(self, job: str, held: bool) -> None:
        self.db.execute("UPDATE jobs SET held = ? WHERE id = ?", (int(held), job))
        self.db.commit()

    def held(self) -> frozenset[str]:
        return frozenset(r[0] for r in self.db.execute(
            "SELECT id FROM jobs WHERE held AND state = 'queued'"))

    def running(self, job: str, partition: str) -> None:
        """On a partition (its first, or another after a stop): started once."""
        self.db.execute("UPDATE jobs SET state = 'running', partition = ?, "
                        "started = coalesce(started, ?) WHERE id = ?",
                        (partition, time.time(), job))
        self.note(job, f"running on {partition}")

    def holding(self, job: str, nodes: int) -> None:
        """A job holds `nodes` nodes from now (0: it has given them back): what it is
        charged for (`usage`)."""
        now = time.time()
        self.db.execute("UPDATE holds SET end = ? WHERE job = ? AND end IS NULL", (now, job))
        if nodes:
            self.db.execute("INSERT INTO holds VALUES (?, ?, ?, NULL)", (job, nodes, now))
        self.db.commit()

    def iteration(self, job: str, i: int, t_start: int, t_end: int) -> None:
        self.db.execute("INSERT INTO iterations VALUES (?, ?, ?, ?)", (job, i, t_start, t_end))
        self.db.commit()

    def note(self, job: str, line: str) -> None:
        self.db.execute("INSERT INTO log VALUES (?, ?, ?)", (job, time.time(), line[:2000]))
        self.db.execute("DELETE FROM log WHERE job = ? AND rowid NOT IN (SELECT rowid FROM "
                        "log WHERE job = ? ORDER BY rowid DESC LIMIT ?)", (job, job, MAX_LOG))
        self.db.commit()

    def unfinished(self) -> list[tuple[str, JobRequest, int]]:
        """Jobs not ended, in submission order: id, request, iterations recorded. A row
        whose request cannot be read is quarantined (its state says so, with why) and the
        rest are served."""
        out = []
        for job, req in self.db.execute("SELECT id, request FROM jobs WHERE state IN "
                                        "('queued', 'running') ORDER BY seq").fetchall():
            if (found := self._request(job, req)) is not None:
                out.append((job, *found))
        return out

    def again(self, job: str) -> tuple[JobRequest, int] | None:
        """A job's request and its iterations recorded, to queue it again (None: no such
        job, or its record cannot be read: then quarantined)."""
        row = self.db.execute("SELECT request FROM jobs WHERE id = ?", (job,)).fetchone()
        return None if row is None else self._request(job, row[0])

    def _request(self, job: str, req: str) -> tuple[JobRequest, int] | None:
        try:
            request = JobRequest(**json.loads(req))
            if request.name != job:
                raise ValueError(f"its request names job {request.name!r}")
        except (TypeError, ValueError) as e:
            self.set(job, "quarantined", ended=time.time(),
                     why=f"its record in the ledger cannot be read: {e}")
            self.note(job, f"quarantined: its record cannot be read ({e})")
            return None
        done = self.db.execute("SELECT count(*) FROM iterations WHERE job = ?",
                               (job,)).fetchone()[0]
        return request, done

    def ended_since(self, t: float, most: int = 100_000) -> list[tuple[str, float]]:
        """The jobs that ended after `t` (Unix time): id and when, oldest first."""
        return [(j, e) for j, e in self.db.execute(
            "SELECT id, ended FROM jobs WHERE ended > ? AND state NOT IN ('queued', "
            "'running') ORDER BY ended LIMIT ?", (t, most))]

    def jobs(self, ids: list[str] | None = None, array: str | None = None
             ) -> list[dict[str, Any]]:
        """Every job (or those named, or an array's tasks, ARRAY_N), in submission order,
        with its iterations done."""
        where, args = (f"WHERE id IN ({', '.join('?' * len(ids))})", tuple(ids)) \
            if ids is not None else ("", ())
        if array is not None:  # (`_` is LIKE's one-character wildcard: escaped)
            where, args = "WHERE id LIKE ? ESCAPE '\\'", (array + "\\_%",)
        rows = self.db.execute(
            "SELECT id, user, state, request, submitted, started, ended, partition, why, "
            "result, held, (SELECT count(*) FROM iterations WHERE iterations.job = jobs.id) "
            f"FROM jobs {where} ORDER BY seq", args).fetchall()
        out = []
        for job_, user_, state, req, sub, start, end, part, why, result, held, done in rows:
            try:
                r = json.loads(req)
                r = r if isinstance(r, dict) else {}
            except (TypeError, ValueError):
                r = {}
            limit = r.get("time_limit_ns")
            out.append({"job": job_, "user": user_, "state": state,
                        "priority": r.get("priority"), "model": r.get("model"),
                        "ranks": r.get("ranks"), "iterations": r.get("iterations"),
                        "iterations_done": done, "held": bool(held),
                        "time_limit_s": limit / 1e9 if isinstance(limit, int) and limit
                        else None, "partition": part, "submitted": sub, "started": start,
                        "ended": end, "why": why or "",
                        "run_dir": str(self.runs / job_) if (self.runs / job_).is_dir()
                        else None,
                        "result": json.loads(result) if result else None})
        return out

    def shown(self, ended: int = 56) -> list[dict[str, Any]]:
        """What the watchers are shown: every job not ended (200 at most), then the latest
        `ended` that have; read by the index, not by a scan of every job."""
        live = [r[0] for r in self.db.execute(
            "SELECT id FROM jobs WHERE state IN ('queued', 'running') ORDER BY seq LIMIT 200")]
        done = [r[0] for r in self.db.execute(
            "SELECT id FROM jobs WHERE state NOT IN ('queued', 'running') ORDER BY seq DESC "
            "LIMIT ?", (ended,))][::-1]
        found = {j["job"]: j for j in self.jobs(live + done)}  # one query
        return [found[name] for name in live + done if name in found]

    def states(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT state, count(*) FROM jobs GROUP BY state"
                                    ).fetchall())

    def job(self, job: str) -> dict[str, Any] | None:
        found = self.jobs([job])
        return found[0] if found else None

    def result(self, job: str, extra: dict[str, Any], end: float) -> dict[str, Any]:
        """A job's result from the durable state, as it ends at `end`: iterations and
        their times, JCT from its submission and its run from its first start (the
        arbiter's time down named apart), and `extra` (what only the last arbiter saw)."""
        j = self.job(job)
        assert j is not None
        its = sorted(t1 - t0 for t0, t1 in self.db.execute(
            "SELECT t_start_ns, t_end_ns FROM iterations WHERE job = ?", (job,)))
        return {**extra, "iterations": len(its),
                "jct_s": round(end - j["submitted"], 3),
                "queued_s": round(j["started"] - j["submitted"], 3) if j["started"] else None,
                "run_s": round(end - j["started"], 3) if j["started"] else None,
                "arbiter_down_s": round(self.down_s(j["submitted"], end), 3),
                "iteration_time_s": round(sum(its) / len(its) / 1e9, 9) if its else None,
                "iteration_p99_s": round(percentile(its, 99) / 1e9, 9) if its else None}

    def logs(self, job: str) -> list[str]:
        return [f"{_stamp(t)} {line}" for t, line in
                self.db.execute("SELECT t, line FROM log WHERE job = ? ORDER BY rowid", (job,))]

    def timeline(self, job: str, since: int = 0, most: int = 10_000) -> list[list[int]]:
        """Its iterations from `since`, `most` at a time: [iteration, t_start_ns, t_end_ns]."""
        return [list(r) for r in self.db.execute(
            "SELECT iteration, t_start_ns, t_end_ns FROM iterations WHERE job = ? AND "
            "iteration >= ? ORDER BY iteration LIMIT ?", (job, since, most))]

    def usage(self, since: float = 0.0, until: float | None = None
              ) -> dict[str, dict[str, Any]]:
        """Per user and per job, over [since, until) (until: now): node-hours held (nodes x
        the time its jobs held them, the part within; no time no arbiter ran, no time
        queued), jobs that held nodes or were submitted within, by state, and the waits
        of those that started within."""
        until = time.time() if until is None else until
        held: dict[str, float] = {}
        for job, nodes, start, end in self.db.execute(
                "SELECT job, nodes, start, coalesce(end, ?) FROM holds WHERE start < ? AND "
                "coalesce(end, ?) > ?", (until, until, until, since)):
            held[job] = held.get(job, 0.0) + nodes * (min(end, until) - max(start, since))
        out: dict[str, dict[str, Any]] = {}
        rows = self.db.execute(
            "SELECT id, user, state, submitted, started FROM jobs WHERE (submitted >= ? AND "
            "submitted < ?) OR id IN (SELECT DISTINCT job FROM holds WHERE start < ? AND "
            "coalesce(end, ?) > ?) ORDER BY seq", (since, until, until, until, since))
        for job, user, state, sub, start in rows:
            u = out.setdefault(user, {"jobs": 0, "states": {}, "node_hours": 0.0,
                                      "waits_s": [], "per_job": {}})
            u["jobs"] += 1
            u["states"][state] = u["states"].get(state, 0) + 1
            hours = held.get(job, 0.0) / 3600
            u["node_hours"] += hours
            u["per_job"][job] = {"state": state, "node_hours": round(hours, 6)}
            if start is not None and since <= start < until:
                u["waits_s"].append(start - sub)
        for u in out.values():
            waits = sorted(u.pop("waits_s"))
            u["node_hours"] = round(u["node_hours"], 6)
            u["wait_mean_s"] = round(sum(waits) / len(waits), 3) if waits else None
            u["wait_max_s"] = round(waits[-1], 3) if waits else None
        return out

    def decayed(self, now: float, half_life_s: float) -> dict[str, float]:
        """Per user, the node-seconds their jobs held, each second worth half as much
        `half_life_s` later (fair share's usage)."""
        out: dict[str, float] = {}
        k = math.log(2) / half_life_s
        for user, nodes, start, end in self.db.execute(
                "SELECT jobs.user, holds.nodes, holds.start, coalesce(holds.end, ?) FROM "
                "holds JOIN jobs ON jobs.id = holds.job WHERE coalesce(holds.end, ?) > ?",
                (now, now, now - 20 * half_life_s)):
            # the integral of nodes * 2^-((now - t) / h) over [start, end]
            out[user] = out.get(user, 0.0) + nodes * (
                math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k
        return out

    def close(self) -> None:
        self.db.close()



def _has_wal(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    return wal.exists() and wal.stat().st_size > 0


def _create(path: Path) -> None:
    """A new ledger, made whole beside its place and then moved there: a crash leaves
    none, never an empty one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    db = open_store(tmp, SCHEMA, SCHEMA_VERSION, "arbiter's ledger")
    db.execute("PRAGMA journal_mode=DELETE")  # (one file to move)
    db.close()
    os.replace(tmp, path)
