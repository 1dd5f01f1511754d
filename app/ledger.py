"""The arbiter service's durable state: every job submitted, its state, each iteration it
recorded, its log and its result, in SQLite (WAL; a commit per change) under the
service's state directory. A killed arbiter started again on the same directory finds
the queue as it was, and each running job's first iteration not recorded; an iteration
is recorded once (the key is the job and the iteration).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from oddl.app.stores import open_store
from oddl.controller.service.jobs import JobRequest

SCHEMA_VERSION = 1  # PRAGMA user_version: a newer one is refused (app/stores.py)
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, seq INTEGER UNIQUE, user TEXT, state TEXT, request TEXT,
    submitted REAL, started REAL, ended REAL, partition TEXT, why TEXT, result TEXT);
CREATE TABLE IF NOT EXISTS iterations (
    job TEXT, iteration INTEGER, t_start_ns INTEGER, t_end_ns INTEGER,
    PRIMARY KEY (job, iteration));
CREATE TABLE IF NOT EXISTS log (job TEXT, t REAL, line TEXT);
"""
STATES = ("queued", "running", "finished", "failed", "cancelled")
ENDED = ("finished", "failed", "cancelled")
MAX_LOG = 1000  # lines kept per job


class Ledger:
    def __init__(self, path: Path) -> None:
        self.db = open_store(path, SCHEMA, SCHEMA_VERSION, "arbiter's ledger")

    def next_id(self) -> str:
        """The next job's id: j1, j2, ..."""
        return f"j{(self.db.execute('SELECT max(seq) FROM jobs').fetchone()[0] or 0) + 1}"

    def add(self, user: str, req: JobRequest) -> None:
        """A new job (named by `next_id`), queued."""
        self.db.execute("INSERT INTO jobs (id, seq, user, state, request, submitted) "
                        "VALUES (?, ?, ?, 'queued', ?, ?)",
                        (req.name, int(req.name[1:]), user, json.dumps(asdict(req)),
                         time.time()))
        self.note(req.name, f"queued by {user} (priority {req.priority})")

    def set(self, job: str, state: str, **fields: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE jobs SET state = ?{', ' + cols if cols else ''} WHERE id = ?",
                        (state, *fields.values(), job))
        self.db.commit()

    def running(self, job: str, partition: str) -> None:
        """On a partition (its first, or another after a stop): started once."""
        self.db.execute("UPDATE jobs SET state = 'running', partition = ?, "
                        "started = coalesce(started, ?) WHERE id = ?",
                        (partition, time.time(), job))
        self.note(job, f"running on {partition}")

    def iteration(self, job: str, i: int, t_start: int, t_end: int) -> None:
        self.db.execute("INSERT INTO iterations VALUES (?, ?, ?, ?)", (job, i, t_start, t_end))
        self.db.commit()

    def note(self, job: str, line: str) -> None:
        self.db.execute("INSERT INTO log VALUES (?, ?, ?)", (job, time.time(), line[:2000]))
        self.db.execute("DELETE FROM log WHERE job = ? AND rowid NOT IN (SELECT rowid FROM "
                        "log WHERE job = ? ORDER BY rowid DESC LIMIT ?)", (job, job, MAX_LOG))
        self.db.commit()

    def unfinished(self) -> list[tuple[str, JobRequest, int]]:
        """Jobs not ended, in submission order: id, request, iterations recorded."""
        out = []
        for job, req in self.db.execute("SELECT id, request FROM jobs WHERE state IN "
                                        "('queued', 'running') ORDER BY seq"):
            done = self.db.execute("SELECT count(*) FROM iterations WHERE job = ?",
                                   (job,)).fetchone()[0]
            out.append((job, JobRequest(**json.loads(req)), done))
        return out

    def jobs(self, job: str | None = None) -> list[dict[str, Any]]:
        """Every job (or the one named), in submission order, with its iterations done."""
        where, args = ("WHERE id = ?", (job,)) if job is not None else ("", ())
        rows = self.db.execute(
            "SELECT id, user, state, request, submitted, started, ended, partition, why, "
            "result, (SELECT count(*) FROM iterations WHERE iterations.job = jobs.id) "
            f"FROM jobs {where} ORDER BY seq", args).fetchall()
        out = []
        for job_, user, state, req, sub, start, end, part, why, result, done in rows:
            r = json.loads(req)
            out.append({"job": job_, "user": user, "state": state, "priority": r["priority"],
                        "model": r["model"], "ranks": r["ranks"],
                        "iterations": r["iterations"], "iterations_done": done,
                        "partition": part, "submitted": sub, "started": start, "ended": end,
                        "why": why or "", "result": json.loads(result) if result else None})
        return out

    def job(self, job: str) -> dict[str, Any] | None:
        found = self.jobs(job)
        return found[0] if found else None

    def logs(self, job: str) -> list[str]:
        return [f"{time.strftime('%H:%M:%S', time.localtime(t))} {line}" for t, line in
                self.db.execute("SELECT t, line FROM log WHERE job = ? ORDER BY rowid", (job,))]

    def timeline(self, job: str, since: int = 0, most: int = 10_000) -> list[list[int]]:
        """Its iterations from `since`, `most` at a time: [iteration, t_start_ns, t_end_ns]."""
        return [list(r) for r in self.db.execute(
            "SELECT iteration, t_start_ns, t_end_ns FROM iterations WHERE job = ? AND "
            "iteration >= ? ORDER BY iteration LIMIT ?", (job, since, most))]

    def close(self) -> None:
        self.db.close()
