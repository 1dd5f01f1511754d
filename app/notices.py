"""Each job's end on the testbed's bus, for scripts and people who were not listening
(issue 86): retained under its own topic, `oddl/TESTBED/telemetry/oddl-ctl/ended/JOB`,
beside the latest end (`.../ended`), and cleared `[notices] keep_s` after it (a day by
default; MQTT 3.1.1 has no expiry of its own, so the arbiter clears it). A subscriber to
`.../ended/+` that connects within that time hears every end it missed. An arbiter that
starts clears the ends its last life had kept long enough, and times the others; what it
says before it is on the bus (it connects at its first job) is said once it is."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oddl.app.queue import Service


def ended(svc: Service, job: str, note: bytes) -> None:
    """A job's end: the latest end, and its own, kept until `keep_s` from now."""
    say = svc.adm.b.announce
    if say is None:
        return
    say("ended", note)
    say(f"ended/{job}", note)
    _clear_at(svc, job, time.time() + svc.limits.notices.keep_s)


def resume(svc: Service, last_seen: float | None) -> None:
    """An arbiter starts: the ends its last life kept (since it was last seen, less
    `keep_s`) are cleared now if they have been kept long enough, else when they have."""
    if svc.adm.b.announce is None or last_seen is None:
        return
    keep = svc.limits.notices.keep_s
    for job, end in svc.ledger.ended_since(last_seen - keep):
        _clear_at(svc, job, end + keep)


def _clear_at(svc: Service, job: str, t: float) -> None:
    def clear() -> None:
        if svc.adm.b.announce is not None:
            svc.adm.b.announce(f"ended/{job}", b"")  # (an empty retained one: none kept)

    svc.adm.b.loop.call_later(max(0.0, t - time.time()), clear)
