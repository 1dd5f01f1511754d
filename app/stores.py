"""The SQLite files oddl keeps (a run's `results.sqlite`, the arbiter's `arbiter.sqlite`):
opened one way, each carrying its schema's version (`PRAGMA user_version`). A file of a
newer schema than this oddl reads is refused with one clear line, never half-read."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path


class StoreError(RuntimeError):
    """A store this oddl cannot use (a newer schema's, or not a database)."""


def check_version(db: sqlite3.Connection, path: Path, version: int, what: str) -> int:
    """The file's schema version; StoreError if it is newer than `version`."""
    try:
        found = int(db.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path}: not {_a(what)} ({e}); move it aside (with its -wal "
                         f"and -shm files) to start a new one") from None
    if found > version:
        raise StoreError(f"{path}: {_a(what)} of schema {found}, written by a newer oddl; "
                         f"this one reads schema {version} and older")
    return found


def _a(what: str) -> str:
    return f"{'an' if what[0] in 'aeiou' else 'a'} {what}"


def open_store(path: Path, schema: str, version: int, what: str,
               timeout_s: float = 60.0) -> sqlite3.Connection:
    """A store for writing: WAL (readers never block it, nor it them), a busy timeout
    (writers wait their turn), its tables, its version said."""
    db = sqlite3.connect(path, timeout=timeout_s)
    try:
        check_version(db, path, version, what)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process
        db.executescript(schema)
        db.execute(f"PRAGMA user_version = {int(version)}")
        db.commit()
    except BaseException:
        db.close()
        raise
    return db


# a writer's waits for another's commit (`write`): the first, then doubling to the longest
WAIT_FIRST_S = 50e-6
WAIT_MOST_S = 1e-3


def writes_in_turn(db: sqlite3.Connection) -> None:
    """Make `db` say at once that another writer holds the store (`write` waits for it)."""
    db.execute("PRAGMA busy_timeout = 0")


def write(db: sqlite3.Connection, work: Callable[[], object], timeout_s: float = 60.0) -> int:
    """One write transaction, `work` then its commit, on a connection that `writes_in_turn`:
    while another process holds the write lock, tried again after 50 us, doubling to 1 ms,
    for `timeout_s` at most (then sqlite3.OperationalError, "database is locked"). Returns
    how many times it waited. SQLite's own wait sleeps 1, 2, 5, 10 ms and more a turn: a
    run's two processes each committing an iteration every half millisecond (Table 1 with
    --every-iteration) spent 1.9 s of the ODDL network's 17 s asleep in it."""
    deadline = time.monotonic() + timeout_s
    wait, waits = WAIT_FIRST_S, 0
    while True:
        try:
            work()
            db.commit()
            return waits
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise
            db.rollback()  # (nothing of it was written: the next try, or call, does it all)
            if time.monotonic() >= deadline:
                raise
        time.sleep(wait)
        waits += 1
        wait = min(2 * wait, WAIT_MOST_S)
