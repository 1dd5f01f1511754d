"""`oddl arbiter`: the long-lived service that owns a testbed, to which people submit jobs.

It holds its state directory's lock and the testbed lock, opens the testbed's devices once
(emu or hw), and runs the one orchestration of jobs (`service.admission`) fed by
submissions (`app.submission`): each job is placed on a rectangle of free nodes, by its
priority now (`app.priority`) with EASY backfill (`service.placing`), within its user's
limits (`app.limits`) and its time limit, planned and applied beside the running ones,
watched, stopped and moved for its own faults only. Its state (`app.ledger`) survives
it: started again on the same state directory, it queues again every job that was queued
or running, each from its first iteration not recorded, and every job's result is read
from there.

HTTP on 127.0.0.1 (Starlette on uvicorn, on the back end's own loop). Every request names
its user (`app.users`) by a bearer token (`DIR/tokens/NAME`, 0600, written at the first start, kept
after; an operator rotates or revokes one). Roles: `operator` (everything), `user`
(submit; cancel and read the logs and iterations of their own jobs), `observer` (read the
queue). Bodies are bounded; a malformed, oversized or
unauthenticated request gets a 4xx, is counted, and changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import msgspec
from oddl.app import amend, arrays, notices, operators, preempt, records, registry, requeue
from oddl.app.dependencies import Dependencies
from oddl.app.job_runs import JobRuns
from oddl.app.ledger import ACTIVE, Ledger
from oddl.app.limits import Limits, load_limits
from oddl.app.priority import Priority, priority_of, share_factors
from oddl.app.requests import json_body
from oddl.app.submission import Refused, Submission, job_request, submission
from oddl.app.users import Role, User, roles_of, tokens
from oddl.controller.base.config import (
    ConfigError,
    ConfigIssue,
    NetworkSpec,
    Testbed,
    load_testbed,
)
from oddl.controller.base.telemetry import (
    TELEMETRY_VERSION,
    EndedNote,
    JobState,
    QueuedJob,
    QueueNote,
)
from oddl.controller.base.topology import Grid
from oddl.controller.service.admission import Admission
from oddl.controller.service.backend import Iteration, RunFailed
from oddl.controller.service.jobs import JobRecord, JobRequest
from oddl.controller.service.lock import TestbedLock
from oddl.controller.service.placing import NEVER, Backfill
from oddl.controller.service.stages import OddlStage1
from oddl.controller.serving import http
from oddl.controller.serving.lifecycle import Services, Stopped
from oddl.controller.stage1.arbiter import Arbiter
from oddl.controller.stage1.placement import Partition
from oddl.controller.stage2.job import job_id
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)
FIRST = 10  # the violations /status shows in full (each: when, what, where, which job)


class Service:
    """The arbiter's state and what each request may do to it."""

    def __init__(self, tb: Testbed, ledger: Ledger, users: dict[str, User], state: Path,
                 limits: Limits, plots: bool = True, roles: dict[str, Role] | None = None
                 ) -> None:
        """Then `attach` its orchestration, built with its `backfill` as the placer and
        the service itself as the jobs' service (`JobService`)."""
        self.tb, self.ledger, self.users, self.state = tb, ledger, users, state
        # every user, token or not (a revoked one holds none)
        self.roles = roles if roles is not None else {u.name: u.role for u in users.values()}
        self.limits = limits
        self.grid = Grid.from_testbed(tb)
        self.rejected = 0  # requests refused: malformed, oversized, unauthenticated, forbidden
        self._told = 0.0  # when the watchers were last told the queue
        self._on: dict[str, str] = {}  # each running job's partition, as the ledger has it
        self._user: dict[str, str] = {}  # each job not ended: its user
        self.held = set(ledger.held())  # queued jobs an operator holds
        self.restarted: set[str] = set()  # jobs an earlier arbiter (or attempt) ran part of
        self.requeueing: dict[str, str] = {}  # running jobs stopping to be queued again: why
        self.lives: dict[str, int] = {}  # jobs not ended queued again: how often
        self.preempting: dict[str, list[str]] = {}  # a queued job: the jobs stopped for it
        self.preempted: dict[str, str] = {}  # a job stopped for another, until it runs again
        self.runs = JobRuns(state, plots)  # each job's run directory
        self.backfill = Backfill(self.grid, self.may_start, self.maintenance)
        self.placer = preempt.Preempting(self, self.backfill)  # backfill, then preemption
        self._compute: dict[str, int] = {}  # each job not ended: its compute (ns)
        self._submitted: dict[str, float] = {}  # each job not ended: when (Unix time)
        self.deps = Dependencies(self)  # what a queued job waits for besides nodes
        self._factors: tuple[float, dict[str, float]] = (-1e9, {})  # when, fair share's
        self.windows = ledger.orders.windows(time.time())  # maintenance, now and to come

    def attach(self, adm: Admission) -> None:
        """The orchestration this service runs its jobs on: the drained nodes kept out,
        the maintenance windows timed."""
        self.adm = adm
        for node, d in self.ledger.orders.drains().items():
            self.adm.closed[node] = f"drained by {d['by']}: {d['why']}"
        for w in self.windows:
            self.time_window(w)

    def tell(self, now: bool = True) -> None:
        """The queue, for the bus's watchers (the dashboard): at once on a change of state,
        at most once a second for progress."""
        t = time.monotonic()
        if not now and t - self._told < 1.0:
            return
        self._told = t
        js = self.ledger.shown()
        waiting = self.waiting()
        on = {r.job: sorted(r.nodes) for r in self.adm.started()}
        note = QueueNote(TELEMETRY_VERSION, self.tb.name, [QueuedJob(
            j["job"], j["user"], j["state"], j["ranks"] or 0, j["iterations_done"],
            j["iterations"] or 0, j["partition"] or "",
            waiting.get(j["job"], {}).get("priority_now", j["priority"] or 0),
            j["held"], waiting.get(j["job"], {}).get("reason", ""),
            on.get(j["job"], []) if j["state"] == "running" else []) for j in js])
        if self.adm.b.announce is not None:
            self.adm.b.announce("queue", msgspec.json.encode(note))

    # --- the queue's rules ---------------------------------------------------------------
    def may_start(self, req: JobRequest, placed: list[tuple[JobRequest, Partition]]) -> bool:
        """Whether a queued job may start now: not held, and its user's running nodes
        (with those placed in this pass) stay within their limit."""
        if req.name in self.held or self.deps.waits_for(req.name):
            return False
        user = self._user.get(req.name, req.user)
        most = self.limits.rule(user, self.role_of(user)).max_running_nodes
        if most is None:
            return True
        held = sum(len(r.nodes) for r in self.adm.started() if self._user.get(r.job) == user)
        held += sum(len(p.nodes) for q, p in placed if self._user.get(q.name) == user)
        return held + req.ranks <= most

    def role_of(self, name: str) -> str:
        return self.roles.get(name, "user")

    def owner(self, job: str) -> str:
        """A job's user (one not ended)."""
        return self._user.get(job, "")

    def maintenance(self, end_ns: int, job: str = "") -> frozenset[str]:
        """The nodes of the maintenance windows, and of the reservations for others than
        `job`'s user or role, that begin before `end_ns` (the admission's clock; NEVER:
        no end) and have not ended: a job that would hold one then waits."""
        now = time.time()
        end = now + (end_ns - self.adm.clock.now_ns()) / 1e9 if end_ns < NEVER else math.inf
        user = self._user.get(job, "")
        mine = {f"user:{user}", f"role:{self.role_of(user)}"} if user else set()
        return frozenset(n for w in self.windows if w["start"] < end and w["end"] > now
                         and w.get("for", "") not in mine for n in w["nodes"])

    def time_window(self, w: dict[str, Any]) -> None:
        """Look at the queue again as a window ends: what waited for its nodes may start."""
        def ended() -> None:
            self.windows = [x for x in self.windows if x["end"] > time.time()]
            self.adm.look()
            self.tell()

        self.adm.b.loop.call_later(max(0.0, w["end"] - time.time()) + 0.01, ended)

    def rank(self, req: JobRequest) -> float:
        """A queued job's priority now (app/priority.py); a preempting job whose victims
        are stopping goes first (the nodes they give back are its)."""
        return math.inf if req.name in self.preempting else self.priority_now(req).total

    def priority_now(self, req: JobRequest) -> Priority:
        now = time.time()
        w = self.limits.priority
        if now - self._factors[0] > 10.0:  # fair share's usage: looked up every 10 s
            self._factors = (now, share_factors(self.ledger.decayed(now, w.half_life_s)))
        return priority_of(req.priority, now - self._submitted.get(req.name, now),
                           self._user.get(req.name, req.user), self._factors[1], w)

    def waiting(self) -> dict[str, dict[str, Any]]:
        """Each queued job: its priority now and its factors, why it waits (Slurm's pending
        reasons, in words) and when it starts at the latest where its reservation says."""
        now_ns, now = self.adm.clock.now_ns(), time.time()
        pending = self.backfill.pending
        setting_up = self.adm.setting_up()
        out = {}
        for q in self.adm.queue:
            why, at, _nodes = pending.get(q.name, ("resources", None, frozenset()))
            waits = self.deps.reason(q.name)
            if why == "ineligible" or q.name in self.held or waits:
                user = self._user.get(q.name, q.user)
                why = ("approval" if self.limits.rule(user, self.role_of(user)).approval
                       else "held") if q.name in self.held else \
                    waits or "user limit (max_running_nodes)"
            if why == "maintenance":
                why = ("maintenance or a reservation for others (a window on the nodes it "
                       "fits before its time limit ends)")
            if q.name in self.preempted:
                why = f"preempted by {self.preempted[q.name]}; {why}"
            elif q.name in self.adm.jobs.stopped:  # (the ledger: still running)
                why = f"stopped for a fault, to go on; {why}"
            out[q.name] = dict[str, Any](self.priority_now(q).public()) | {
                "reason": why, "expected_start": round(now + (at - now_ns) / 1e9, 3)
                if at is not None and at < NEVER else None}
        for job in setting_up:
            out[job] = {"reason": "starting (its stage 1 is under way)",
                        "expected_start": None}
        for job in self.adm.jobs.tasks.keys() - self._on.keys():  # (the ledger: queued)
            out[job] = {"reason": "starting (placed; its first iteration under way)",
                        "expected_start": None}
        return out

    def queue(self, user: User, req: JobRequest, asked_s: float | None) -> JobRequest:
        """A submission held to its user's rules: its priority, their queued jobs, its time
        limit; Refused (403, 422 or 429) naming the rule."""
        rule = self.limits.rule(user.name, user.role)
        if req.priority > rule.max_priority:
            raise Refused(403, f"priority {req.priority} is over {user.name}'s most, "
                               f"{rule.max_priority} (max_priority)")
        if rule.max_queued_jobs is not None:
            queued = sum(1 for j in self._user.items() if j[1] == user.name)
            if queued >= rule.max_queued_jobs:
                raise Refused(429, f"{user.name} has {queued} jobs queued or running, "
                                   f"their most (max_queued_jobs {rule.max_queued_jobs})")
        most = rule.max_running_nodes
        if most is not None and req.ranks > most:
            raise Refused(422, f"{req.ranks} ranks: over {user.name}'s most running nodes, "
                               f"{most} (max_running_nodes): it could never start")
        try:
            limit_s = self.limits.time_limit_s(asked_s)
        except ValueError as e:
            raise Refused(422, f"time_limit_s: {e}") from None
        return dataclasses.replace(req, user=user.name, time_limit_ns=round(limit_s * 1e9))

    # --- what the orchestration tells -------------------------------------------------
    def on_iteration(self, rec: JobRecord, it: Iteration) -> None:
        part = rec.partition.describe() if rec.partition else ""
        moved = self._on.get(rec.name) != part  # its first iteration on this partition
        if moved:
            self._on[rec.name] = part
            self.preempted.pop(rec.name, None)
            self.ledger.running(rec.name, part)
        # the run directory before the ledger: a kill between loses nothing (JobRuns)
        self.runs.iteration(rec.name, it.iteration, it.t_start, it.t_end,
                            self._compute.get(rec.name, 0), it.control_messages, it.flows)
        self.ledger.iteration(rec.name, it.iteration, it.t_start, it.t_end)
        self.tell(now=moved)

    def on_hold(self, job: str, nodes: int) -> None:
        self.ledger.holding(job, nodes)  # what it is charged for

    def on_end(self, rec: JobRecord, state: str, why: str) -> None:
        if requeue.ended(self, rec.name, state, why):  # queued again, not ended
            self._on.pop(rec.name, None)  # (its next start is told the ledger)
            return
        seen = {"flows": rec.flows, "control_messages": rec.control_messages,
                "stops": rec.stops, "disturbance": rec.disturbance,
                "invariant_violations": rec.violations} if rec.start_ns is not None else {}
        ended = time.time()
        result = self.ledger.result(rec.name, {
            "nodes": len(rec.partition.nodes) if rec.partition else 0,
            "shape": rec.partition.shape if rec.partition else None} | (
            {f"{k}_since_restart" if rec.name in self.restarted else k: v
             for k, v in seen.items()}), ended)
        self.ledger.set(rec.name, state, ended=ended, why=why, result=json.dumps(result))
        self.ledger.note(rec.name, f"{state}{': ' + why if why else ''}")
        j = self.ledger.job(rec.name) or {}
        notices.ended(self, rec.name, msgspec.json.encode(EndedNote(
            TELEMETRY_VERSION, self.tb.name, rec.name, j.get("user") or "unknown",
            cast(JobState, state), why[:512], j.get("iterations_done", 0),
            j.get("iterations") or 0, ended)))
        self.runs.end(rec.name, j, rec.disturbance, rec.control_messages)
        self._compute.pop(rec.name, None)
        self._submitted.pop(rec.name, None)
        self._factors = (-1e9, {})  # its usage counts from now
        self.deps.ended(rec.name)
        self._on.pop(rec.name, None)
        self.lives.pop(rec.name, None)
        self.preempted.pop(rec.name, None)
        self._user.pop(rec.name, None)
        self.held.discard(rec.name)
        self.restarted.discard(rec.name)
        self.tell()

    # --- requests ---------------------------------------------------------------------
    def who(self, request: Request, *roles: Role) -> User:
        """The user the request's token names (`http.BearerToken` has checked it), if
        their role may do this."""
        user: User = request.scope["party"]
        if roles and user.role not in roles:
            raise Refused(403, f"{user.name} ({user.role}) may not do this")
        return user

    def owned(self, user: User, job: str) -> dict[str, Any]:
        j = self.ledger.job(job)
        if j is None:
            raise Refused(404, f"no job {job}")
        if user.role != "operator" and j["user"] != user.name:
            raise Refused(403, f"job {job} is {j['user']}'s, not {user.name}'s")
        return j

    async def submit(self, request: Request) -> Response:
        """A job, or an array of them (`array`: one task a value, `ID_N`, each its
        experiment with `seed = N`; app/arrays.py)."""
        user = self.who(request, "operator", "user")
        sub = submission(await json_body(request))
        if sub.after is not None:
            self.deps.check(user, sub.after)
        text, priority = sub.experiment, sub.priority
        if sub.array is None:
            req = job_request(text, self.grid, self.tb, self.ledger.next_id(), priority)
            return JSONResponse(self.enqueue(user, sub, text, req), status_code=201)
        base = self.ledger.next_id()
        texts = {t: arrays.task_text(text, t) for t in arrays.tasks(sub.array)}
        # every task checked as a job before one is queued
        reqs = {t: job_request(x, self.grid, self.tb, f"{base}_{t}", priority)
                for t, x in texts.items()}
        return JSONResponse({"array": base, "tasks": [
            self.enqueue(user, sub, texts[t], reqs[t]) for t in texts]}, status_code=201)

    def enqueue(self, user: User, sub: Submission, text: str, req: JobRequest
                ) -> dict[str, Any]:
        """One job of a submission (its request `req` made of `text`), queued: its
        record."""
        after = sub.after
        in_file = req.time_limit_ns / 1e9 if req.time_limit_ns else None
        req = self.queue(user, req, sub.time_limit_s if sub.time_limit_s is not None
                         else in_file)
        if sub.webhook is not None:  # (checked before it is queued)
            req = dataclasses.replace(req, webhook=notices.allowed(self.limits.notices,
                                                                   sub.webhook))
        if sub.singleton:
            req = dataclasses.replace(req, singleton=True)
        if after is not None:
            req = dataclasses.replace(req, after=after)
        self.ledger.add(user.name, req)
        self.runs.begin(req.name, user.name, req, text)
        self.known(req, user.name, time.time())
        if after is not None:
            parent, _, cond = after.partition(":")
            self.ledger.note(req.name, f"waits for {parent}" + {
                "ok": " to finish", "notok": " to end otherwise than finished"}.get(cond, ""))
        if self.limits.rule(user.name, user.role).approval:  # the approve gate
            self.held.add(req.name)
            self.ledger.hold(req.name, True)
            self.ledger.note(req.name, "held for an operator's approval (`oddl release`)")
        try:
            self.adm.submit(req)
        except RunFailed as e:  # as many jobs at once as the flow tags tell apart
            self.ledger.set(req.name, "failed", ended=time.time(), why=str(e))
            self._user.pop(req.name, None)
            raise Refused(503, str(e)) from None
        self.tell()
        j = self.ledger.job(req.name)
        assert j is not None
        return j

    def known(self, req: JobRequest, user: str, submitted: float) -> None:
        """A job not ended, as the service keeps it in memory (from a submission, or from
        the ledger at a start)."""
        self._user[req.name] = user
        self._compute[req.name] = req.compute_ns
        self._submitted[req.name] = submitted
        self.deps.add(req, user)

    async def jobs(self, request: Request) -> Response:
        """Every job, or those of `user` and in `state`; each queued one with its
        priority now, why it waits and when it starts at the latest (`waiting`)."""
        self.who(request)
        users = set(request.query_params.getlist("user"))
        states = set(request.query_params.getlist("state"))
        waiting = self.waiting()
        return JSONResponse({"jobs": [
            j | waiting.get(j["job"], {}) for j in self.ledger.jobs()
            if (not users or j["user"] in users) and (not states or j["state"] in states)]})

    async def job(self, request: Request) -> Response:
        self.who(request)
        j = self.ledger.job(request.path_params["job"])
        if j is None:  # an array's id: its tasks as one
            return JSONResponse(arrays.as_one(self, request.path_params["job"]))
        return JSONResponse(j | self.waiting().get(j["job"], {}))

    async def cancel(self, request: Request) -> Response:
        user = self.who(request, "operator", "user")
        if self.ledger.job(request.path_params["job"]) is None:  # an array: every task
            return JSONResponse(arrays.cancel(self, user, request.path_params["job"]))
        j = self.owned(user, request.path_params["job"])
        if j["state"] not in ACTIVE:
            raise Refused(409, f"job {j['job']} is {j['state']}: nothing to cancel")
        if not self.adm.cancel(j["job"], f"cancelled by {user.name}"):
            # (the ledger is told a moment after the job ends: it may still say running)
            raise Refused(409, f"job {j['job']} is ending already, or being cancelled: "
                               f"nothing to cancel")
        return JSONResponse({"job": j["job"], "cancelled": True})

    def _queued(self, job: str) -> dict[str, Any]:
        j = self.ledger.job(job)
        if j is None:
            raise Refused(404, f"no job {job}")
        if j["state"] != "queued":
            raise Refused(409, f"job {job} is {j['state']}, not queued")
        return j

    async def hold(self, request: Request) -> Response:
        """An operator holds a queued job (it starts only once released) or releases it."""
        user = self.who(request, "operator")
        job, held = request.path_params["job"], request.url.path.endswith("/hold")
        self._queued(job)
        if held:
            self.held.add(job)
        else:
            self.held.discard(job)
        self.ledger.hold(job, held)
        self.ledger.note(job, f"{'held' if held else 'released'} by {user.name}")
        self.adm.look()  # (what waits behind it, and why, changes either way)
        self.tell()
        return JSONResponse(self.ledger.job(job))

    async def priority(self, request: Request) -> Response:
        """An operator moves a queued job: its new priority (the queue is by priority,
        then arrival)."""
        user = self.who(request, "operator")
        job = request.path_params["job"]
        self._queued(job)
        p = (await json_body(request)).get("priority")
        if not isinstance(p, int) or isinstance(p, bool) or not -1000 <= p <= 1000:
            raise Refused(422, '{"priority": -1000..1000}')
        req = next((q for q in self.adm.queue if q.name == job), None)
        if req is None or not self.adm.reprioritise(job, p):
            raise Refused(409, f"job {job} is not in the queue")
        self.ledger.request(job, dataclasses.replace(req, priority=p))
        self.ledger.note(job, f"priority {req.priority} -> {p} by {user.name}")
        self.tell()
        return JSONResponse(self.ledger.job(job))

    def nodes(self) -> dict[str, dict[str, str]]:
        """Each node's state: "free", "held" (by `job`), "down" (out of service: the watch
        found it dead or unreachable), "drained" or "closed" (an operator's word, or a
        device that would not clear it: `why`); a held node that is also down or drained
        says both."""
        down = self.adm.health.out_of_service()
        on = {n: r.job for r in self.adm.started() for n in r.nodes}
        now = time.time()
        out = {}
        for n in self.grid.nodes:
            d: dict[str, str] = {"state": "free"}
            if n not in self.adm.free:
                d = {"state": "held", "job": on.get(n, "(being given back)")}
            if n in down:
                d |= {"state": "down"} if d["state"] == "free" else {"also": "down"}
            if (w := next((w for w in self.windows if n in w["nodes"]
                           and w["start"] <= now < w["end"]), None)) is not None:
                what = "maintenance" if not w.get("for") else "reserved"
                d |= ({"state": what} if d["state"] == "free" else {"also": what}) | {
                    "why": f"{what}{' for ' + w['for'] if w.get('for') else ''} by "
                           f"{w['by']}: {w['why']}"}
            if (why := self.adm.closed.get(n)) is not None:
                state = "drained" if why.startswith("drained") else "closed"
                d |= ({"state": state} if d["state"] == "free" else {"also": state}) | \
                    {"why": why}
            out[n] = d
        return out

    async def status(self, request: Request) -> Response:
        self.who(request)
        nodes = self.nodes()
        pending = self.backfill.pending
        now_ns, now = self.adm.clock.now_ns(), time.time()
        reserved = next(({"job": job, "start": round(now + (at - now_ns) / 1e9, 3),
                          "nodes": sorted(where)}
                         for job, (_why, at, where) in pending.items()
                         if at is not None and at < NEVER), None)
        return JSONResponse({"testbed": self.tb.name, "rejected": self.rejected,
                             "jobs": self.ledger.states(),
                             "free_nodes": sum(1 for d in nodes.values()
                                               if d["state"] == "free"),
                             "nodes": nodes, "reservation": reserved,
                             "maintenance": self.windows,
                             "setting_up": self.adm.setting_up(),
                             "invariant_violations": len(self.adm.b.monitor.violations),
                             "first_violations": self.adm.b.monitor.violations[:FIRST]})

    def app(self) -> Starlette:
        def op(fn: Callable[[Service, Request], Awaitable[Response]]
               ) -> Callable[[Request], Awaitable[Response]]:
            return functools.partial(fn, self)  # a request a module of its own answers

        def guarded(fn: Callable[[Request], Awaitable[Response]]
                    ) -> Callable[[Request], Awaitable[Response]]:
            async def handle(request: Request) -> Response:
                try:
                    return await fn(request)
                except Refused as e:
                    self.rejected += 1
                    log.warning("arbiter: %s %s refused (%d): %s", request.method,
                                request.url.path, e.status, e)
                    return JSONResponse({"error": str(e)}, status_code=e.status)
            return handle

        return Starlette(routes=[
            Route("/jobs", guarded(self.jobs), methods=["GET"]),
            Route("/jobs", guarded(self.submit), methods=["POST"]),
            Route("/jobs/{job}", guarded(self.job), methods=["GET"]),
            Route("/jobs/{job}", guarded(self.cancel), methods=["DELETE"]),
            Route("/jobs/{job}/hold", guarded(self.hold), methods=["POST"]),
            Route("/jobs/{job}/release", guarded(self.hold), methods=["POST"]),
            Route("/jobs/{job}/priority", guarded(self.priority), methods=["PUT"]),
            Route("/jobs/{job}/requeue", guarded(op(requeue.requeue)), methods=["POST"]),
            Route("/jobs/{job}/time_limit", guarded(op(amend.time_limit)), methods=["PUT"]),
            Route("/jobs/{job}/logs", guarded(op(records.logs)), methods=["GET"]),
            Route("/jobs/{job}/iterations", guarded(op(records.iterations)), methods=["GET"]),
            Route("/jobs/{job}/flows", guarded(op(records.flows)), methods=["GET"]),
            Route("/usage", guarded(op(records.usage)), methods=["GET"]),
            Route("/tokens/{user}", guarded(op(operators.token)), methods=["POST", "DELETE"]),
            Route("/status", guarded(self.status), methods=["GET"]),
            Route("/nodes/{node}/drain", guarded(op(operators.drain)), methods=["POST"]),
            Route("/nodes/{node}/resume", guarded(op(operators.drain)), methods=["POST"]),
            Route("/users/{user}", guarded(op(operators.user)), methods=["POST", "DELETE"]),
            Route("/maintenance", guarded(op(operators.maintain)), methods=["POST"]),
            Route("/maintenance/{window}", guarded(op(operators.maintain)),
                  methods=["DELETE"]),
        ], middleware=[Middleware(http.BearerToken, tokens=self.users,
                                  refused=self._unknown)])

    def _unknown(self, why: str) -> None:
        """A request with no valid token: counted and logged, as any refusal."""
        self.rejected += 1
        log.warning("arbiter: a request refused (401): %s", why)


def serve(testbed: Path, state: Path, users: list[str], host: str = "127.0.0.1",
          port: int = 8060, tls: tuple[Path, Path] | None = None,
          say: Callable[[str], None] = print, limits: Path | None = None,
          plots: bool = True) -> None:
    """Run the service until SIGINT or SIGTERM (a clean stop keeps every job's state, as
    a crash does); `plots`: each ended job's plot.png."""

    if not ipaddress.ip_address(host).is_loopback and tls is None:
        raise ValueError(f"--host {host}: beyond loopback the API needs TLS (--tls-cert, "
                         f"--tls-key) or a reverse proxy in front of 127.0.0.1 "
                         f"(docs/arbiter.md)")
    tb = load_testbed(testbed)
    rules = load_limits(limits)
    if not registry.serves(tb).devices:
        raise ConfigError([ConfigIssue(
            str(testbed), "testbed.backend", "the arbiter owns devices: give an emu config "
            "(`oddl emulate TESTBED --out emu.toml`) or a lab's hw config")])
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    me = f"oddl arbiter (pid {os.getpid()})"
    # the state first: a second arbiter on it is refused before it touches anything
    with TestbedLock("arbiter", me, directory=state, kind="state directory").acquire():
        ledger = Ledger(state / "arbiter.sqlite")
        try:
            # --user's, but those an operator removed, and those an operator added
            known = ledger.orders.users()
            users = [u for u in users if known.get(u.partition(":")[0]) != "removed"]
            named = {u.partition(":")[0] for u in users}
            users += [f"{n}:{r}" for n, r in known.items() if n not in named and r != "removed"]
            users_by_token = tokens(state, users)
            roles = roles_of(users)
            other = ledger.testbed(tb.name)
            if other is not None:
                raise ValueError(f"--state {state}: it holds testbed {other!r}'s jobs, not "
                                 f"{tb.name!r}'s: give each testbed's arbiter its own")
            _serve(tb, state, ledger, users_by_token, rules, host, port, tls, say, plots,
                   roles)
        finally:
            ledger.close()


def _serve(tb: Testbed, state: Path, ledger: Ledger, users: dict[str, User], rules: Limits,
           host: str, port: int, tls: tuple[Path, Path] | None,
           say: Callable[[str], None], plots: bool, roles: dict[str, Role]) -> None:
    grid = Grid.from_testbed(tb)
    with TestbedLock(registry.lock_name(tb), f"oddl arbiter (pid {os.getpid()})").acquire():
        backend = registry.open_backend(tb.testbed.backend, tb, grid)
        try:
            arbiter = Arbiter(tb, grid, backend.onics, backend.wss, backend.fan_out)
            arbiter.inventory()
            spec = NetworkSpec(name="oddl", kind="oddl")  # the testbed's, as planned

            svc = Service(tb, ledger, users, state, rules, plots, roles)
            svc.attach(Admission(backend, grid, [], svc.placer, OddlStage1(arbiter, spec),
                                 spec, tb, job_id("arbiter", os.getpid(), time.time_ns()),
                                 "arbiter", svc.on_iteration, record_flows=True,
                                 service=svc))
            api = http.HttpService(svc.app(), host, port,
                                   ssl_certfile=tls[0] if tls else None,
                                   ssl_keyfile=tls[1] if tls else None)

            async def alive() -> None:  # its downtime, if it dies, counts from its last beat
                while True:
                    ledger.alive()
                    await asyncio.sleep(1.0)

            async def main() -> None:
                async with Services(f"arbiter of {tb.name}") as services:
                    down = ledger.begin(os.getpid())
                    notices.resume(svc, time.time() - down if down is not None else None)
                    svc.adm.open()
                    services.add("the jobs' run directories", svc.runs.close)
                    services.add("the orchestration of jobs", svc.adm.close)
                    for job, req, done in ledger.unfinished():  # what the last one left
                        j = ledger.job(job) or {}
                        was = j.get("state")
                        svc.known(req, j.get("user") or req.user,
                                   j.get("submitted") or time.time())
                        if was == "running":
                            svc.restarted.add(job)
                        ledger.set(job, "queued")
                        gone = f" (no arbiter for {down:.1f} s)" if down is not None else ""
                        ledger.note(job, f"the arbiter started again{gone}: queued again "
                                         f"from iteration {done}")
                        svc.adm.submit(req, resume=done)
                    svc.tell()
                    beat = asyncio.get_running_loop().create_task(alive())
                    services.add("its heartbeat in the ledger", beat.cancel)
                    await services.start("its API", api.start(), api.stop)
                    say(f"ready {api.url}")
                    await services.run(api.wait())

            try:
                backend.loop.run_until_complete(main())
            except Stopped as e:
                e.notes.append(f"every job's state is kept in {state} (a new arbiter on it "
                               f"goes on with them)")
                raise
        finally:
            backend.close()
