"""Preemption (issue 86): a job of a preempting class (`preempt = true` for its user's role
or its user, in the limits file) that waits for nodes stops running jobs of classes that
do not preempt, the fewest nodes that let it start, and starts on them. Each job stopped
is queued again with its recorded iterations kept (app/requeue.py) and goes on from there
once nodes are free. A job never stops one of its own class, nor one being stopped
already; one preemption at a time (the next waits until its nodes are taken). Both jobs'
logs say who stopped whom and why, and `oddl jobs` gives a preempted job's reason."""

from __future__ import annotations

import itertools
import logging
from typing import Protocol

from oddl.app.arbiter_view import Kept, Watched
from oddl.app.limits import Limits
from oddl.controller.base.topology import Grid
from oddl.controller.service.health import Health
from oddl.controller.service.jobs import JobRequest
from oddl.controller.service.placing import NEVER, Backfill, Running
from oddl.controller.stage1.placement import Partition, place


class Preemptible(Kept, Watched, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""

    grid: Grid
    limits: Limits
    backfill: Backfill
    preempting: dict[str, list[str]]
    preempted: dict[str, str]
    requeueing: dict[str, str]

    def owner(self, job: str) -> str: ...

    def role_of(self, name: str) -> str: ...

    def rank(self, req: JobRequest) -> float: ...

    def maintenance(self, end_ns: int, job: str = "") -> frozenset[str]: ...


log = logging.getLogger("oddl.app.queue")  # the arbiter's one log
MAX_TRIES = 5000  # sets of running jobs tried for one waiting job


class Preempting:
    """The arbiter's placer: its backfill, and after each pass in which a preempting job
    was left waiting, preemption (on the next pass of the loop, outside the admission's)."""

    def __init__(self, svc: Preemptible, backfill: Backfill) -> None:
        self.svc, self.backfill = svc, backfill

    def place(self, free: set[str], health: Health, queue: list[JobRequest],
              running: list[Running], now_ns: int) -> list[tuple[JobRequest, Partition]]:
        out = self.backfill.place(free, health, queue, running, now_ns)
        placed = {r.name for r, _p in out}
        if any(q.name not in placed and preempts(self.svc, q.name) for q in queue):
            self.svc.adm.b.loop.call_soon(look, self.svc)
        return out

    def eligible(self, req: JobRequest) -> bool:
        return self.backfill.eligible(req)


def preempts(svc: Preemptible, job: str) -> bool:
    """Whether a job's class preempts: its user's rule (their entry, else their role's)."""
    user = svc.owner(job)
    return svc.limits.rule(user, svc.role_of(user)).preempt


def look(svc: Preemptible) -> None:
    """The highest-ranked preempting job that waits for nodes, and the jobs to stop."""
    adm = svc.adm
    queued = {q.name for q in adm.queue}
    for job in [j for j in svc.preempting if j not in queued]:
        del svc.preempting[job]  # placed (or gone): its nodes are taken
    if svc.preempting:
        return
    for q in sorted(adm.queue, key=lambda r: -svc.rank(r)):
        why = svc.backfill.pending.get(q.name, ("resources",))[0]
        if not preempts(svc, q.name) or why not in ("resources", "reservation") \
                or not svc.backfill.eligible(q):
            continue  # (held, a dependency, a user limit, nodes out of service: stopping
            # others would not start it)
        victims = _victims(svc, q)
        if victims:
            _stop(svc, q, victims)
            return


def _victims(svc: Preemptible, q: JobRequest) -> list[str]:
    """The fewest running jobs (then the fewest nodes) of classes that do not preempt
    whose nodes, with the free ones in service, hold `q` (none: stopping gives it nothing)."""
    adm = svc.adm
    now = adm.clock.now_ns()
    end = now + q.time_limit_ns if q.time_limit_ns else NEVER
    usable = adm.free - set(adm.closed) - adm.health.out_of_service() - svc.maintenance(
        end, q.name)
    running = sorted(((r.job, r.nodes) for r in adm.started() if r.job in adm.jobs.tasks
                      and r.job not in svc.requeueing and not preempts(svc, r.job)),
                     key=lambda r: (len(r[1]), r[0]))
    tries = 0
    for k in range(1, len(running) + 1):
        for combo in itertools.combinations(running, k):
            tries += 1
            if tries > MAX_TRIES:
                return []
            nodes = usable.union(*(n for _j, n in combo))
            if place(svc.grid, set(nodes), q.name, q.ranks, q.shape, q.exact,
                     q.group) is not None:
                return [j for j, _n in combo]
    return []


def _stop(svc: Preemptible, q: JobRequest, victims: list[str]) -> None:
    user = svc.owner(q.name)
    svc.preempting[q.name] = victims
    for v in victims:
        why = f"preempted by {q.name} ({user}, {svc.role_of(user)})"
        if svc.adm.cancel(v, why):
            svc.requeueing[v] = why
            svc.preempted[v] = q.name
            svc.ledger.note(v, why)
    svc.ledger.note(q.name, f"preempts {', '.join(victims)}: stopped to start it")
    log.warning("arbiter: %s (%s) preempts %s", q.name, user, ", ".join(victims))
    svc.tell()
