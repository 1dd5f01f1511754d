"""Run directories: manifest, a crash-safe results store and the summary (its plot:
app/experiments/figures.py).

The store is SQLite in WAL mode with one commit per iteration: a run killed at any moment
leaves every completed iteration (and its flows) readable; the iteration being simulated
is lost whole, never half-written. Readers never block it (WAL), and a writer waits its
turn (the busy timeout) rather than failing: watching a run with `sqlite3` or pandas is
safe. A reader open when the run ends keeps `results.sqlite-wal` beside the file until it
closes.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sqlite3
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from oddl.app.stores import check_version, open_store, write, writes_in_turn
from oddl.controller.service.backend import Repeats

SCHEMA_VERSION = 1  # PRAGMA user_version: a newer one is refused (app/stores.py)
SCHEMA = """
CREATE TABLE IF NOT EXISTS networks (name TEXT PRIMARY KEY, kind TEXT, meta TEXT);
CREATE TABLE IF NOT EXISTS iterations (
    network TEXT, iteration INTEGER, t_start_ns INTEGER, t_end_ns INTEGER,
    compute_ns INTEGER, comm_ns INTEGER, flows INTEGER, control_messages INTEGER,
    PRIMARY KEY (network, iteration));
CREATE TABLE IF NOT EXISTS outcomes (network TEXT PRIMARY KEY, disturbed INTEGER,
    disturbance TEXT);
CREATE TABLE IF NOT EXISTS faults (network TEXT, kind TEXT, target TEXT, at_ns INTEGER,
    detected_after_ns INTEGER, recovered_after_ns INTEGER, replans INTEGER,
    iterations_lost INTEGER, flows_retried INTEGER, recovered INTEGER);
CREATE TABLE IF NOT EXISTS job_iterations (
    network TEXT, job TEXT, iteration INTEGER, t_start_ns INTEGER, t_end_ns INTEGER,
    PRIMARY KEY (network, job, iteration));
CREATE TABLE IF NOT EXISTS jobs (network TEXT, job TEXT, arrival_ns INTEGER,
    start_ns INTEGER, end_ns INTEGER, nodes TEXT, PRIMARY KEY (network, job));
CREATE TABLE IF NOT EXISTS flows (
    network TEXT, iteration INTEGER, flow INTEGER, step INTEGER, src TEXT, dst TEXT,
    bytes INTEGER, hops INTEGER, t_submit_ns INTEGER, t_deliver_ns INTEGER);
"""

FlowRow = tuple[int, int, str, str, int, int, int, int]  # flow, step, src, dst, bytes, hops, ts, td


class RunStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        # several writers (a run's networks in processes of their own: each commits its
        # iterations): each waits its turn for the write lock
        self.db = open_store(path, SCHEMA, SCHEMA_VERSION, "run's results store")
        writes_in_turn(self.db)
        self.waits = 0  # times a write waited for another process's commit (stores.write)
        self.timeout_s = 60.0  # the longest a write waits for it
        # iterations (and their flows) held for the next commit
        self._its: list[tuple[Any, ...]] = []
        self._flows: list[tuple[Any, ...]] = []
        self._copies: list[list[Any]] = []  # [network, repeats, first, last] of copies
        self._replaced: list[tuple[str, int]] = []  # (network, iteration) recorded again

    def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """One statement over `rows`, committed (in turn with the run's other writers)."""
        self.waits += write(self.db, lambda: self.db.executemany(sql, rows), self.timeout_s)

    def begin_network(self, name: str, kind: str, meta: dict[str, Any]) -> None:
        self._write("INSERT OR REPLACE INTO networks VALUES (?, ?, ?)",
                    [(name, kind, json.dumps(meta))])

    def add_iteration(self, network: str, iteration: int, t_start: int, t_end: int,
                      compute_ns: int, control_messages: int, flows: list[FlowRow],
                      replace: bool = False, commit: bool = True,
                      repeats: Repeats | None = None) -> None:
        """One iteration and its flows, committed together (`commit` False: held, and
        written with a later one). `repeats`: it is a copy of a repeated iteration, its
        flows that one's (`Repeats.flows_of`), written by SQLite itself (a run's copies
        come all at once: Table 1's are 800,000 rows). `replace`: a record of it already
        here is replaced (an arbiter killed after this write and before its ledger's runs
        the iteration again), else it is refused (IntegrityError)."""
        if replace:
            self._replaced.append((network, iteration))
        n = len(flows) if repeats is None else len(repeats.flows)
        self._its.append((network, iteration, t_start, t_end, compute_ns,
                          t_end - t_start - compute_ns, n, control_messages))
        if repeats is not None:
            runs = self._copies
            if runs and runs[-1][0] == network and runs[-1][1] is repeats and \
                    runs[-1][3] == iteration - 1:
                runs[-1][3] = iteration
            else:
                runs.append([network, repeats, iteration, iteration])
        self._flows += [(network, iteration, *f) for f in flows]
        if commit:
            db = self.db

            def held() -> None:
                db.executemany("DELETE FROM flows WHERE network = ? AND iteration = ?",
                               self._replaced)
                db.executemany(f"INSERT {'OR REPLACE ' if replace else ''}INTO iterations "
                               "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self._its)
                db.executemany("INSERT INTO flows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               self._flows)
                for net, rep, first, last in self._copies:
                    self._copy_flows(net, rep, first, last)

            self.waits += write(db, held, self.timeout_s)
            self._its, self._flows, self._copies, self._replaced = [], [], [], []

    def _copy_flows(self, network: str, rep: Repeats, first: int, last: int) -> None:
        """The flows of copies first .. last of `rep`'s iteration, in the order a run
        writes them (iteration by iteration, each in its flows' order)."""
        db = self.db
        db.execute("CREATE TEMP TABLE IF NOT EXISTS repeated (pos INTEGER PRIMARY KEY, "
                   "flow INTEGER, id_step INTEGER, step INTEGER, src TEXT, dst TEXT, "
                   "bytes INTEGER, hops INTEGER, t_submit_ns INTEGER, t_deliver_ns INTEGER)")
        db.execute("DELETE FROM repeated")
        db.executemany("INSERT INTO repeated VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [(i, f[0], d, *f[1:]) for i, (f, d)
                        in enumerate(zip(rep.flows, rep.id_steps, strict=True))])
        db.execute(
            "WITH RECURSIVE k(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM k WHERE i < ?) "
            "INSERT INTO flows SELECT ?, k.i, r.flow + (k.i - ?) * r.id_step, r.step, r.src, "
            "r.dst, r.bytes, r.hops, r.t_submit_ns + (k.i - ?) * ?, "
            # (k outside, its iterations in order; each copy's flows in their order: a
            # recursive CTE is a FIFO, CROSS JOIN keeps k the outer loop; ORDER BY would
            # sort what already is, at three times the cost)
            "r.t_deliver_ns + (k.i - ?) * ? FROM k CROSS JOIN repeated r",
            (first, last, network, rep.of, rep.of, rep.period_ns, rep.of, rep.period_ns))

    def add_flows(self, network: str, rows: list[tuple[Any, ...]]) -> None:
        """Flow rows of iterations already recorded (iteration, then a FlowRow): a job an
        arbiter ran, copied from its run directory."""
        db = self.db

        def insert() -> None:
            db.executemany("INSERT INTO flows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(network, *r) for r in rows])
            db.execute("UPDATE iterations SET flows = (SELECT COUNT(*) FROM flows f WHERE "
                       "f.network = iterations.network AND f.iteration = "
                       "iterations.iteration) WHERE network = ?", (network,))

        self.waits += write(db, insert, self.timeout_s)

    def add_job_iteration(self, network: str, job: str, iteration: int, t_start: int,
                          t_end: int) -> None:
        """One iteration of one of several jobs (committed at once, as any iteration)."""
        self._write("INSERT INTO job_iterations VALUES (?, ?, ?, ?, ?)",
                    [(network, job, iteration, t_start, t_end)])

    def set_job(self, network: str, job: str, arrival_ns: int, start_ns: int | None,
                end_ns: int | None, nodes: list[str]) -> None:
        """Where and when a job ran (start and end: None until it did)."""
        self._write("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?)",
                    [(network, job, arrival_ns, start_ns, end_ns, json.dumps(nodes))])

    def add_faults(self, network: str, rows: list[dict[str, Any]]) -> None:
        self._write("INSERT INTO faults VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(network, r["kind"], r["target"], r["at_ns"], r["detected_after_ns"],
                      r["recovered_after_ns"], r["replans"], r["iterations_lost"],
                      r["flows_retried"],
                      None if r["recovered"] is None else int(r["recovered"])) for r in rows])

    def set_outcome(self, network: str, disturbed: bool, disturbance: dict[str, int]) -> None:
        """How clean the network's run was: its disturbance counters, and the verdict."""
        self._write("INSERT OR REPLACE INTO outcomes VALUES (?, ?, ?)",
                    [(network, int(disturbed), json.dumps(disturbance))])

    def close(self) -> None:
        """The last connection to close folds the WAL into the file (SQLite does it); while
        someone reads the store, the WAL stays beside it until they are done. Never a
        change of journal mode here: that needs the file alone, and a reader (sqlite3,
        pandas) holding it open failed the run at its very end ("database is locked")."""
        self.db.close()


def reading(path: Path) -> str:
    """The URI that reads a store without writing beside it. A store no one writes has no
    write-ahead log (its writer's close removes it), and is read as immutable: a read-only
    reader of a WAL database otherwise leaves an empty -wal and a -shm beside a finished
    run's store (every run's plot did). One being written (or left by a killed run) has its
    log, and is read through it."""
    wal = path.with_name(path.name + "-wal")
    return f"file:{path}?mode=ro" + ("" if wal.exists() else "&immutable=1")


def read_store(path: Path, flow_rows: bool = True) -> dict[str, Any]:
    """Everything completed so far, per network (works on a store left by a killed run).
    `flow_rows` False: their count left out (a scan of every flow row: Table 1's 800,000
    twice, 80 ms of its plot's half second, which reads the iterations alone)."""
    db = sqlite3.connect(reading(path), uri=True)
    try:
        check_version(db, path, SCHEMA_VERSION, "run's results store")
        out: dict[str, Any] = {}
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        for name, kind, meta in db.execute("SELECT name, kind, meta FROM networks"):
            rows = db.execute("SELECT iteration, t_start_ns, t_end_ns, compute_ns, comm_ns, "
                              "flows, control_messages FROM iterations WHERE network = ? "
                              "ORDER BY iteration", (name,)).fetchall()
            nflows = db.execute("SELECT COUNT(*) FROM flows WHERE network = ?",
                                (name,)).fetchone()[0] if flow_rows else None
            outcome = db.execute("SELECT disturbed, disturbance FROM outcomes WHERE "
                                 "network = ?", (name,)).fetchone()
            out[name] = {"kind": kind, "meta": json.loads(meta), "iterations": rows,
                         "flow_rows": nflows}
            if outcome is not None:
                out[name] |= {"disturbed": bool(outcome[0]),
                              "disturbance": json.loads(outcome[1])}
            cur = db.execute("SELECT kind, target, at_ns, detected_after_ns, "
                             "recovered_after_ns, replans, iterations_lost, flows_retried, "
                             "recovered FROM faults WHERE network = ?", (name,))
            cols = [c[0] for c in cur.description]
            out[name]["faults"] = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
            jobs = {}
            for job, arr, start, end, nodes in db.execute(
                    "SELECT job, arrival_ns, start_ns, end_ns, nodes FROM jobs WHERE "
                    "network = ? ORDER BY arrival_ns, job", (name,)) \
                    if "jobs" in tables else ():
                its = db.execute("SELECT iteration, t_start_ns, t_end_ns FROM job_iterations "
                                 "WHERE network = ? AND job = ? ORDER BY iteration",
                                 (name, job)).fetchall()
                jobs[job] = {"arrival_ns": arr, "start_ns": start, "end_ns": end,
                             "nodes": json.loads(nodes), "iterations": its}
            if jobs:
                out[name]["jobs"] = jobs
        return out
    finally:
        db.close()


class RunDirTaken(FileExistsError):
    """--out names a directory that already holds a run: never write over results."""


def make_run_dir(out: Path | None, experiment: str) -> Path:
    if out is not None:
        if (out / "results.sqlite").exists():
            raise RunDirTaken(f"{out} already holds a run (results.sqlite): choose another "
                              f"--out, or move that run away first")
        if out.exists() and not out.is_dir():
            raise RunDirTaken(f"--out {out} is a file, not a directory for the run")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirTaken(f"--out {out}: {e.strerror or e}") from None
        return out
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{experiment}-{stamp}"
    d, k = base, 1
    while d.exists():
        k += 1
        d = Path(f"{base}-{k}")
    d.mkdir(parents=True)
    return d


def git_revision() -> str:
    here = Path(__file__).resolve().parent
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                           text=True, timeout=5, check=False)
        rev = r.stdout.strip()
        if not rev:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True,
                               text=True, timeout=5, check=False).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in ("oddl", "numpy", "pydantic", "msgspec", "click", "rich", "matplotlib"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def write_manifest(run_dir: Path, files: dict[str, Path], info: dict[str, Any]) -> None:
    manifest = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(),
        "argv": sys.argv,
        "git_revision": git_revision(),
        "packages": package_versions(),
        "configs": {k: {"path": str(p), "text": p.read_text()} for k, p in files.items()},
        **info,
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
