"""The SQLite files oddl keeps (a run's `results.sqlite`, the arbiter's `arbiter.sqlite`):
opened one way, each carrying its schema's version (`PRAGMA user_version`). A file of a
newer schema than this oddl reads is refused with one clear line, never half-read."""

from __future__ import annotations

import sqlite3
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
