"""What a queued job waits for besides nodes (issues 64, 86): `oddl submit --after
ID[:ok|:notok]` (another job's end, or its finishing, or its ending otherwise; a condition
that can no longer be met cancels the job, saying so) and `--singleton` (no earlier job of
the same user and the same name, the experiment's `name`, is queued or running: Slurm's
singleton)."""

from __future__ import annotations

import re
from typing import Protocol

from oddl.app.arbiter_view import Kept, Parties
from oddl.app.ledger import ACTIVE
from oddl.app.submission import Refused
from oddl.app.users import User
from oddl.controller.service.jobs import JobRequest


class Depended(Kept, Parties, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""


def _seq(job: str) -> tuple[int, int]:
    """A job's place in submission order from its id: jN, or an array's task jN_T."""
    n, _, t = job[1:].partition("_")
    return int(n), int(t) if t else -1


class Dependencies:
    """Each job not ended: its `--after` parent and condition, its user and name."""

    def __init__(self, svc: Depended) -> None:
        self.svc = svc
        self.after: dict[str, tuple[str, str]] = {}  # a queued job: its parent, "", ok, notok
        self.named: dict[str, tuple[str, str]] = {}  # every job not ended: (user, name)
        self.singleton: set[str] = set()

    def check(self, user: User, after: object) -> None:
        """`after`: "jN", "jN:ok" or "jN:notok", a job of the user's (an operator's:
        anyone's); Refused naming why not."""
        if not isinstance(after, str) or not (
                m := re.fullmatch(r"(j\d{1,12})(:ok|:notok)?", after)):
            raise Refused(422, 'after: a job id, "jN" (after it ends), "jN:ok" (after it '
                               'finishes) or "jN:notok" (after it ends otherwise)')
        self.svc.owned(user, m.group(1))

    def add(self, req: JobRequest, user: str) -> None:
        if req.after:
            parent, _, cond = req.after.partition(":")
            self.after[req.name] = (parent, cond)
        self.named[req.name] = (user, req.title)
        if req.singleton:
            self.singleton.add(req.name)

    def waits_for(self, job: str) -> str | None:
        """The job `job` waits for (its parent, or an earlier one of its name), if any."""
        return self._parent(job) or self._namesake(job)

    def reason(self, job: str) -> str | None:
        """Why a queued job waits, in words, if it is for another job."""
        if (parent := self._parent(job)) is not None:
            return f"dependency on {parent}"
        if (other := self._namesake(job)) is not None:
            return f"singleton: {other} of the same name comes first"
        return None

    def ended(self, job: str) -> None:
        """A job has ended: forgotten, and the jobs after it looked at again (they may
        start, or they never will)."""
        self.after.pop(job, None)
        self.named.pop(job, None)
        self.singleton.discard(job)
        for child in [c for c, (parent, _cond) in self.after.items() if parent == job]:
            self._parent(child)

    def _namesake(self, job: str) -> str | None:
        if job not in self.singleton:
            return None
        me = self.named.get(job)
        return next((j for j, n in sorted(self.named.items(), key=lambda x: _seq(x[0]))
                     if n == me and _seq(j) < _seq(job)), None)

    def _parent(self, job: str) -> str | None:
        """The parent a queued job waits for, if it has not ended; one that ended otherwise
        than its child asked ends the child (cancelled, saying so)."""
        if job not in self.after:
            return None
        parent, cond = self.after[job]
        j = self.svc.ledger.job(parent)
        state = j["state"] if j else "gone"
        if state in ACTIVE:
            return parent
        if cond and (cond == "ok") != (state == "finished"):  # :ok, or :notok, not met
            adm = self.svc.adm
            adm.b.loop.call_soon(adm.cancel, job, f"its dependency {parent} ended "
                                 + (f"{state}, not finished" if cond == "ok" else
                                    "finished (it was to run only if not)"))
        del self.after[job]
        return None
