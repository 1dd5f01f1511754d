"""What the arbiter has recorded of its jobs, as its clients read it: a job's iterations,
its flows (a page at a time), its log, and the users' usage. Each request is answered
from the durable state (the ledger, the job's run directory), to its user and the
operators (usage: an observer too, every user's; a user, their own)."""

from __future__ import annotations

from typing import Protocol

from oddl.app.arbiter_view import Kept, Parties
from oddl.app.job_runs import JobRuns
from oddl.app.operators import MAX_UNIX_TIME
from oddl.app.requests import query_number
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class Recorded(Kept, Parties, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""

    runs: JobRuns


FLOWS_PAGE = 20_000  # flow rows an answer holds (about 2 MB of JSON)
MAX_ROW = (1 << 62) - 1  # a row or iteration number a query names (SQLite's are 64-bit)


async def iterations(svc: Recorded, request: Request) -> Response:
    """A job's recorded iterations, `[[i, t_start_ns, t_end_ns], ...]`, from `since`
    (its user's and the operators')."""
    user = svc.who(request, "operator", "user")
    job = request.path_params["job"]
    svc.owned(user, job)
    since = int(query_number(request, "since", "an iteration number", 0, MAX_ROW, int))
    return JSONResponse({"job": job, "iterations": svc.ledger.timeline(job, since)})


async def flows(svc: Recorded, request: Request) -> Response:
    """A job's flows as its ranks reported them (its run directory's flows table),
    `[[row, iteration, flow, step, src, dst, bytes, hops, t_submit_ns, t_deliver_ns],
    ...]`, after row `after`, FLOWS_PAGE at most (`more`: there are others); its
    user's and the operators'."""
    user = svc.who(request, "operator", "user")
    job = svc.owned(user, request.path_params["job"])["job"]
    after = int(query_number(request, "after", "a row number", 0, MAX_ROW, int))
    rows = svc.runs.flows(job, after, FLOWS_PAGE + 1)
    return JSONResponse({"job": job, "flows": rows[:FLOWS_PAGE],
                         "more": len(rows) > FLOWS_PAGE})


async def logs(svc: Recorded, request: Request) -> Response:
    """A job's log, every event with its time (its user's and the operators')."""
    user = svc.who(request, "operator", "user")
    j = svc.owned(user, request.path_params["job"])
    return JSONResponse({"job": j["job"], "log": svc.ledger.logs(j["job"])})


async def usage(svc: Recorded, request: Request) -> Response:
    """Per user: jobs, node-hours, wait times (an operator's or an observer's: every
    user's; a user's: their own)."""
    user = svc.who(request)
    since = query_number(request, "since", "a Unix time", 0.0, MAX_UNIX_TIME, float)
    until = query_number(request, "until", "a Unix time", 0.0, MAX_UNIX_TIME, float) \
        if "until" in request.query_params else None
    out = svc.ledger.usage(since, until)
    if user.role == "user":
        out = {k: v for k, v in out.items() if k == user.name}
    return JSONResponse({"since": since, "until": until, "users": out})
