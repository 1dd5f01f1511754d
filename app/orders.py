"""What the arbiter's operators have ordered, kept in its ledger's database beside the
jobs (app/ledger.py): nodes drained, users added and removed, maintenance windows and
reservations for users. A start of the arbiter reads them back (app/queue.py)."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any


class Orders:
    """The operators' standing orders, on the ledger's connection (its commits are theirs:
    each order committed as it is given)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def drain(self, node: str, why: str | None, by: str = "") -> None:
        """`node` drained (why), or resumed (None)."""
        if why is None:
            self.db.execute("DELETE FROM drains WHERE node = ?", (node,))
        else:
            self.db.execute("INSERT OR REPLACE INTO drains VALUES (?, ?, ?, ?)",
                            (node, why, by, time.time()))
        self.db.commit()

    def drains(self) -> dict[str, dict[str, Any]]:
        return {n: {"why": w, "by": b, "since": t} for n, w, b, t in
                self.db.execute("SELECT node, why, by, t FROM drains ORDER BY node")}

    def user(self, name: str, role: str, by: str) -> None:
        """A user an operator added with `role`, or removed (role "removed")."""
        self.db.execute("INSERT OR REPLACE INTO users VALUES (?, ?, ?, ?)",
                        (name, role, by, time.time()))
        self.db.commit()

    def maintain(self, nodes: list[str], start: float, end: float, why: str, by: str,
                 holder: str = "") -> int:
        """A maintenance window (`holder` "": no job on its nodes), or a reservation for
        `holder` ("user:NAME", "role:ROLE": only its jobs on them): its id."""
        cur = self.db.execute("INSERT INTO maintenance (nodes, start, end, why, by, holder) "
                              "VALUES (?, ?, ?, ?, ?, ?)",
                              (json.dumps(nodes), start, end, why, by, holder))
        self.db.commit()
        return int(cur.lastrowid or 0)

    def unmaintain(self, window: int) -> bool:
        gone = self.db.execute("DELETE FROM maintenance WHERE id = ?", (window,)).rowcount
        self.db.commit()
        return bool(gone)

    def windows(self, after: float) -> list[dict[str, Any]]:
        """The maintenance windows and reservations that end after `after`, by start."""
        return [{"id": i, "nodes": json.loads(n), "start": a, "end": b, "why": w, "by": by,
                 "for": h}
                for i, n, a, b, w, by, h in self.db.execute(
                    "SELECT id, nodes, start, end, why, by, holder FROM maintenance WHERE "
                    "end > ? ORDER BY start, id", (after,))]

    def users(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT name, role FROM users ORDER BY name").fetchall())
