"""A job's terms changed after its submission (issue 86): `oddl update ID --time-limit S`,
by its user or an operator, within the arbiter's caps (`max_time_limit_s`). A queued job
takes the new limit when it starts; a running one counts it from its first start, as
every limit is counted, so one that has run past it already ends now (`timeout`). The
ledger keeps it across restarts, and the job's log says who changed it, from what."""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from oddl.app.arbiter_view import Kept, Parties, Watched
from oddl.app.ledger import ACTIVE
from oddl.app.limits import Limits
from oddl.app.requests import json_body
from oddl.app.submission import Refused
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class Amending(Kept, Parties, Watched, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""

    limits: Limits


async def time_limit(svc: Amending, request: Request) -> Response:
    """PUT /jobs/{job}/time_limit {"time_limit_s": S}."""
    user = svc.who(request, "operator", "user")
    j = svc.owned(user, request.path_params["job"])
    job = j["job"]
    if j["state"] not in ACTIVE:
        raise Refused(409, f"job {job} is {j['state']}: it has no time left to change")
    s = (await json_body(request)).get("time_limit_s")
    if not isinstance(s, int | float) or isinstance(s, bool) or not math.isfinite(s) \
            or s <= 0:
        raise Refused(422, '{"time_limit_s": seconds, more than 0}')
    try:
        s = svc.limits.time_limit_s(float(s))
    except ValueError as e:
        raise Refused(422, f"time_limit_s: {e}") from None
    limit_ns = round(s * 1e9)
    found = svc.ledger.again(job)
    if found is None or not svc.adm.set_time_limit(job, limit_ns):
        raise Refused(409, f"job {job} is ending")
    req = found[0]
    svc.ledger.request(job, dataclasses.replace(req, time_limit_ns=limit_ns))
    was = f"{req.time_limit_ns / 1e9:g} s" if req.time_limit_ns else "none"
    svc.ledger.note(job, f"time limit {was} -> {s:g} s by {user.name}")
    svc.tell()
    return JSONResponse(svc.ledger.job(job))
