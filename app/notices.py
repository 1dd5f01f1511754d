"""Each job's end told to whoever was not listening (issue 86).

On the testbed's bus: retained under its own topic, `oddl/TESTBED/telemetry/oddl-ctl/
ended/JOB`, beside the latest end (`.../ended`), and cleared `[notices] keep_s` after it
(a day by default; MQTT 3.1.1 has no expiry of its own, so the arbiter clears it). A
subscriber to `.../ended/+` that connects within that time hears every end it missed. An
arbiter that starts clears the ends its last life had kept long enough, and times the
others; what it says before it is on the bus (it connects at its first job) is said once
it is.

To a webhook a submission names (`oddl submit --webhook URL`): the end's note POSTed as
JSON, only to an address under one an operator allows (`[notices] allow`; none by
default), each try within `timeout_s`, `retries` more after a failure or a 5xx (1, 2, 4
... s apart), never following a redirect, on the arbiter's loop without blocking it; the
job's log says how it went."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import httpx
from oddl.app.arbiter_view import Kept
from oddl.app.limits import Limits, Notices
from oddl.app.submission import Refused


class Noticing(Kept, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""

    limits: Limits


log = logging.getLogger("oddl.app.queue")  # the arbiter's one log
_calls: set[asyncio.Task[None]] = set()  # webhooks under way (held: a task is not kept)


def allowed(cfg: Notices, url: Any) -> str:
    """A submission's webhook, if it is under an address the operator allows; Refused
    (422) naming why not."""
    if why := cfg.refuses(url):
        raise Refused(422, f"webhook: {why}")
    return str(httpx.URL(url))


def ended(svc: Noticing, job: str, note: bytes) -> None:
    """A job's end: the latest end, and its own, kept until `keep_s` from now; and its
    webhook called, if it names one."""
    say = svc.adm.b.announce
    if say is not None:
        say("ended", note)
        say(f"ended/{job}", note)
        _clear_at(svc, job, time.time() + svc.limits.notices.keep_s)
    found = svc.ledger.again(job)
    hooks = {found[0].webhook} if found is not None and found[0].webhook else set()
    user = (svc.ledger.job(job) or {}).get("user", "")
    if mine := svc.limits.notices.users.get(user):
        hooks.add(mine)  # the user's standing webhook, told every end of theirs
    for url in sorted(hooks):
        task = svc.adm.b.loop.create_task(_call(svc, job, url, note))
        _calls.add(task)
        task.add_done_callback(_calls.discard)


async def _call(svc: Noticing, job: str, url: str, note: bytes) -> None:
    cfg = svc.limits.notices
    why = ""
    async with httpx.AsyncClient(follow_redirects=False, timeout=cfg.timeout_s) as c:
        for attempt in range(1 + cfg.retries):
            if attempt:
                await asyncio.sleep(min(2.0 ** (attempt - 1), 30.0))
            try:
                r = await c.post(url, content=note,
                                 headers={"content-type": "application/json"})
            except httpx.HTTPError as e:
                why = f"{type(e).__name__}: {e}"[:200]
                continue
            if r.is_success:
                svc.ledger.note(job, f"webhook {url}: told ({r.status_code})")
                return
            why = f"answered {r.status_code}" + (": a redirect is not followed"
                                                 if r.is_redirect else "")
            if r.status_code < 500:
                break  # (a redirect or a refusal: trying again would change nothing)
    log.warning("arbiter: %s: webhook %s not told: %s", job, url, why)
    svc.ledger.note(job, f"webhook {url}: not told ({why})")


def resume(svc: Noticing, last_seen: float | None) -> None:
    """An arbiter starts: the ends its last life kept (since it was last seen, less
    `keep_s`) are cleared now if they have been kept long enough, else when they have."""
    if svc.adm.b.announce is None or last_seen is None:
        return
    keep = svc.limits.notices.keep_s
    for job, end in svc.ledger.ended_since(last_seen - keep):
        _clear_at(svc, job, end + keep)


def _clear_at(svc: Noticing, job: str, t: float) -> None:
    def clear() -> None:
        if svc.adm.b.announce is not None:
            svc.adm.b.announce(f"ended/{job}", b"")  # (an empty retained one: none kept)

    svc.adm.b.loop.call_later(max(0.0, t - time.time()), clear)
