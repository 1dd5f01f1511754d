"""A job put back in the arbiter's queue with its recorded iterations kept (issue 86): by
its user or an operator (`oddl requeue`); or by the arbiter when faults stopped it more
often than a job may be stopped (MAX_STOPS): then held, with the reason, for an operator
to release (`oddl release`) or cancel.

A running job is stopped first, as a cancel stops it (its light lands, its partition goes
back); the iteration it was in runs again. An ended job that did not finish goes on from
its first iteration not recorded. Either way it keeps its id, its user, its submission
time and its run directory; its ledger log says who queued it again, and why."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from oddl.app.arbiter_view import Kept, Parties, Watched
from oddl.app.submission import Refused
from oddl.controller.service.admission import STOPPED_TOO_OFTEN
from oddl.controller.service.backend import RunFailed
from oddl.controller.service.jobs import JobRequest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class Requeueing(Kept, Parties, Watched, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""

    held: set[str]
    restarted: set[str]
    requeueing: dict[str, str]
    lives: dict[str, int]

    def known(self, req: JobRequest, user: str, submitted: float) -> None: ...


log = logging.getLogger("oddl.app.queue")  # the arbiter's one log
AGAIN = ("failed", "cancelled", "timeout")  # ended states a job can be queued again from


async def requeue(svc: Requeueing, request: Request) -> Response:
    """POST /jobs/{job}/requeue: the job's user or an operator. A job that ran out of its
    time limit is queued again by an operator only (its user would otherwise lift it)."""
    user = svc.who(request, "operator", "user")
    j = svc.owned(user, request.path_params["job"])
    job, state = j["job"], j["state"]
    why = f"requeued by {user.name}"
    if state == "timeout" and user.role != "operator":
        raise Refused(403, f"job {job} ran out of its time limit: an operator requeues it")
    if state == "running":
        if job in svc.requeueing or not svc.adm.cancel(job, why):
            raise Refused(409, f"job {job} is ending already, or being requeued")
        svc.requeueing[job] = why  # `ended` below, once it has stopped
        log.warning("arbiter: %s: %s", job, why)
        return JSONResponse({"job": job, "requeued": True, "from_iteration":
                             j["iterations_done"]}, status_code=202)
    if state not in AGAIN:
        raise Refused(409, f"job {job} is {state}: nothing to queue again")
    if j["iterations_done"] >= (j["iterations"] or 0):
        raise Refused(409, f"job {job} recorded all its {j['iterations']} iterations")
    queue_again(svc, job, why)
    return JSONResponse({"job": job, "requeued": True,
                         "from_iteration": j["iterations_done"]})


def ended(svc: Requeueing, job: str, state: str, why: str) -> bool:
    """A job has ended: queued again instead (True) if it was stopped to be (one that
    finished, or failed, as it was being stopped ends so), or held if faults stopped it
    too often."""
    asked = svc.requeueing.pop(job, None)
    if asked is not None and state in ("cancelled", "timeout"):
        queue_again(svc, job, asked)
        return True
    if state == "failed" and STOPPED_TOO_OFTEN in why:
        queue_again(svc, job, f"{why}; held for an operator (`oddl release {job}` to go on, "
                              f"`oddl cancel {job}` to end it)", hold=True)
        return True
    return False


def queue_again(svc: Requeueing, job: str, why: str, hold: bool = False) -> None:
    """Into the queue again from its first iteration not recorded (on the next pass of the
    loop: the orchestration forgets an ended job after telling the service)."""
    found = svc.ledger.again(job)
    if found is None:  # quarantined: its record cannot be read
        return
    req, done = found
    j = svc.ledger.job(job) or {}
    svc.ledger.set(job, "queued", ended=None, why="")
    svc.ledger.note(job, f"{why}: queued again from iteration {done}")
    if hold:
        svc.held.add(job)
        svc.ledger.hold(job, True)
    svc.restarted.add(job)  # its result counts what was seen of it since
    svc.known(req, j.get("user") or req.user, j.get("submitted") or time.time())

    life = svc.lives[job] = svc.lives.get(job, 0) + 1

    def submit() -> None:
        try:
            svc.adm.submit(req, resume=done, life=life)
        except RunFailed as e:  # as many jobs at once as the flow tags tell apart
            svc.ledger.set(job, "failed", ended=time.time(), why=str(e))
        svc.tell()

    asyncio.get_running_loop().call_soon(submit)
