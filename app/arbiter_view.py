"""What the arbiter's parts see of its service (`Service`, app/queue.py).

The request handlers and hooks kept beside the queue (amend, arrays, dependencies, notices,
operators, preempt, records, requeue) are each typed against the few members they use,
built of the protocols here, not against the whole service: the queue imports them, and
none of them imports the queue, not even for a type (import-linter counts those too).
"""

from __future__ import annotations

from typing import Any, Protocol

from oddl.app.ledger import Ledger
from oddl.app.users import Role, User
from oddl.controller.service.admission import Admission
from starlette.requests import Request


class Kept(Protocol):
    """The ledger, and the orchestration the jobs run on."""

    ledger: Ledger
    adm: Admission


class Parties(Protocol):
    """Who asks, and which jobs are theirs."""

    def who(self, request: Request, *roles: Role) -> User: ...

    def owned(self, user: User, job: str) -> dict[str, Any]: ...


class Watched(Protocol):
    """The queue's watchers (the dashboard), told of a change."""

    def tell(self, now: bool = True) -> None: ...
