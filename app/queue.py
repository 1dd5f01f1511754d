"""`oddl arbiter`: the long-lived service that owns a testbed, to which people submit jobs.

It holds the testbed lock, opens the testbed's devices once (emu or hw), and runs the one
orchestration of jobs (`service.admission`) fed by submissions: each job is placed on a
rectangle of free nodes, by priority then arrival, planned and applied beside the running
ones, watched, stopped and moved for its own faults only. Its state (`service.ledger`)
survives it: started again on the same state directory, it queues again every job that
was queued or running, each from its first iteration not recorded.

HTTP on 127.0.0.1 (Starlette on uvicorn, on the back end's own loop). Every request names
its user by a bearer token (`DIR/tokens/NAME`, 0600, written at the first start, kept
after). Roles: `operator` (everything), `user` (submit; cancel and read the logs of their
own jobs), `observer` (read the queue). Bodies are bounded; a malformed, oversized or
unauthenticated request gets a 4xx, is counted, and changes nothing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import secrets
import time
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

import msgspec
from oddl.app import registry
from oddl.app.ledger import Ledger
from oddl.controller.base.access import read_secret
from oddl.controller.base.config import (
    ConfigError,
    ConfigIssue,
    Experiment,
    JobEntry,
    NetworkSpec,
    Testbed,
    field_issues,
    load_testbed,
    parallelism_issues,
)
from oddl.controller.base.telemetry import TELEMETRY_VERSION, QueuedJob, QueueNote
from oddl.controller.base.topology import Grid
from oddl.controller.service.admission import Admission
from oddl.controller.service.backend import Iteration, RunFailed
from oddl.controller.service.jobs import JobRecord, JobRequest
from oddl.controller.service.lock import TestbedLock
from oddl.controller.service.placing import Rectangles
from oddl.controller.service.stages import OddlStage1
from oddl.controller.serving import http
from oddl.controller.serving.lifecycle import Services, Stopped
from oddl.controller.stage1.arbiter import Arbiter
from oddl.controller.stage1.placement import fits
from oddl.controller.stage2.job import job_id
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)
FIRST = 10  # the violations /status shows in full (each: when, what, where, which job)
MAX_BODY = 256 * 1024  # a submitted experiment, and anything else a client sends
Role = Literal["operator", "user", "observer"]
ROLES: tuple[str, ...] = get_args(Role)


class Refused(Exception):
    """A request the service refuses: its HTTP status and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class User:
    name: str
    role: Role


def tokens(state: Path, users: list[str]) -> dict[str, User]:
    """token -> user, for `--user NAME[:ROLE]` (role default `user`): a token per user in
    `state/tokens/NAME` (0600, in a 0700 directory), made at the first start and kept."""
    d = state / "tokens"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    out = {}
    for spec in users:
        name, _, role = spec.partition(":")
        role = role or "user"
        if role not in ROLES:
            raise ValueError(f"--user {spec}: role {role!r} is not one of {', '.join(ROLES)}")
        if not name.isidentifier():
            raise ValueError(f"--user {spec}: a user name is letters, digits and _")
        f = d / name
        if not f.exists():
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, secrets.token_urlsafe(32).encode())
            os.close(fd)
        out[read_secret(f)] = User(name, cast(Role, role))  # one of ROLES: checked above
    return out


def job_request(text: str, grid: Grid, tb: Testbed, name: str, priority: int) -> JobRequest:
    """A submitted experiment's one workload as a job for this testbed (its `testbed` and
    `networks` are the arbiter's); Refused (422) with why it cannot be one."""
    try:
        data = tomllib.loads(text)
        exp = Experiment.model_validate({"networks": [{"name": "oddl", "kind": "oddl"}],
                                         **data, "testbed": tb.name})
    except tomllib.TOMLDecodeError as e:
        raise Refused(422, f"not TOML: {e}") from None
    except ValidationError as e:
        raise Refused(422, "; ".join(f"{f}: {why}" for f, why in field_issues(e))) from None
    w = exp.workload
    if w is None:
        raise Refused(422, "submit an experiment of one [workload] (a job), not [[jobs]]")
    if w.compute_time_ms is None and w.parallelism is None:
        raise Refused(422, "workload.compute_time_ms: give it (the arbiter calibrates nothing)")
    # its batch where it gives one (JobEntry's default otherwise)
    batch: dict[str, Any] = {"batch_per_node": w.batch_per_node} if w.batch_per_node else {}
    try:
        entry = JobEntry(name="job", model=w.model, collective=w.collective,
                         ranks=w.ranks or tb.n_nodes, iterations=exp.iterations,
                         epochs=None if exp.iterations else w.epochs,
                         dataset_samples=None if exp.iterations else w.dataset_samples,
                         bytes_per_param=w.bytes_per_param, compute_time_ms=w.compute_time_ms,
                         parallelism=w.parallelism,
                         **batch)
    except ValidationError as e:
        raise Refused(422, "; ".join(f"workload.{f}: {why}" for f, why in field_issues(e))
                      ) from None
    if w.parallelism is not None:
        bad = parallelism_issues(w.parallelism, w.model, w.collective, entry.ranks, tb,
                                 whole_grid=False)  # its own rectangle, as [[jobs]]
        if bad:
            raise Refused(422, "; ".join(f"workload.{f}: {why}" for f, why in bad))
    req = JobRequest.of(entry)
    if not fits(grid, req.ranks, req.shape, req.exact, req.group):
        raise Refused(422, f"no rectangle of {tb.name}'s {tb.grid.rows} x {tb.grid.cols} grid "
                           f"holds {req.ranks} ranks: this job can never run here")
    return dataclasses.replace(req, name=name, priority=priority)


class Service:
    """The arbiter's state and what each request may do to it."""

    def __init__(self, tb: Testbed, ledger: Ledger, users: dict[str, User],
                 make: Callable[[Service], Admission]) -> None:
        self.tb, self.ledger, self.users = tb, ledger, users
        self.grid = Grid.from_testbed(tb)
        self.rejected = 0  # requests refused: malformed, oversized, unauthenticated, forbidden
        self._told = 0.0  # when the watchers were last told the queue
        self._on: dict[str, str] = {}  # each running job's partition, as the ledger has it
        self.adm = make(self)

    def tell(self, now: bool = True) -> None:
        """The queue, for the bus's watchers (the dashboard): at once on a change of state,
        at most once a second for progress."""
        t = time.monotonic()
        if not now and t - self._told < 1.0:
            return
        self._told = t
        js = self.ledger.jobs()
        shown = [j for j in js if j["state"] in ("queued", "running")][:200]
        shown += [j for j in js if j["state"] not in ("queued", "running")][-(256 - len(shown)):]
        note = QueueNote(TELEMETRY_VERSION, self.tb.name, [QueuedJob(
            j["job"], j["user"], j["state"], j["ranks"], j["iterations_done"], j["iterations"],
            j["partition"] or "") for j in shown])
        if self.adm.b.announce is not None:
            self.adm.b.announce("queue", msgspec.json.encode(note))

    # --- what the orchestration tells -------------------------------------------------
    def on_iteration(self, rec: JobRecord, it: Iteration) -> None:
        part = rec.partition.describe() if rec.partition else ""
        moved = self._on.get(rec.name) != part  # its first iteration on this partition
        if moved:
            self._on[rec.name] = part
            self.ledger.running(rec.name, part)
        self.ledger.iteration(rec.name, it.iteration, it.t_start, it.t_end)
        self.tell(now=moved)

    def on_end(self, rec: JobRecord, state: str, why: str) -> None:
        result = rec.public() | {"flows": rec.flows, "control_messages": rec.control_messages} \
            if rec.start_ns is not None and rec.end_ns is not None else {}
        self.ledger.set(rec.name, state, ended=time.time(), why=why,
                        result=json.dumps(result))
        self.ledger.note(rec.name, f"{state}{': ' + why if why else ''}")
        self._on.pop(rec.name, None)
        self.tell()

    # --- requests ---------------------------------------------------------------------
    def who(self, request: Request, *roles: Role) -> User:
        """The user the request's token names (`http.BearerToken` has checked it), if
        their role may do this."""
        user: User = request.scope["party"]
        if roles and user.role not in roles:
            raise Refused(403, f"{user.name} ({user.role}) may not do this")
        return user

    async def body(self, request: Request) -> dict[str, Any]:
        try:
            length = int(request.headers.get("content-length") or 0)
        except ValueError:
            raise Refused(400, "Content-Length: not a number") from None
        if length > MAX_BODY:
            raise Refused(413, f"a body of at most {MAX_BODY} bytes")
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise Refused(413, f"a body of at most {MAX_BODY} bytes")
        try:
            out = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise Refused(400, f"not JSON: {e}") from None
        if not isinstance(out, dict):
            raise Refused(400, "a JSON object")
        return out

    def owned(self, user: User, job: str) -> dict[str, Any]:
        j = self.ledger.job(job)
        if j is None:
            raise Refused(404, f"no job {job}")
        if user.role != "operator" and j["user"] != user.name:
            raise Refused(403, f"job {job} is {j['user']}'s, not {user.name}'s")
        return j

    async def submit(self, request: Request) -> Response:
        user = self.who(request, "operator", "user")
        body = await self.body(request)
        text, priority = body.get("experiment"), body.get("priority", 0)
        if not isinstance(text, str) or not isinstance(priority, int) or \
                isinstance(priority, bool) or not -1000 <= priority <= 1000:
            raise Refused(422, '{"experiment": TOML text, "priority": -1000..1000}')
        req = job_request(text, self.grid, self.tb, self.ledger.next_id(), priority)
        self.ledger.add(user.name, req)
        try:
            self.adm.submit(req)
        except RunFailed as e:  # as many jobs at once as the flow tags tell apart
            self.ledger.set(req.name, "failed", ended=time.time(), why=str(e))
            raise Refused(503, str(e)) from None
        self.tell()
        return JSONResponse(self.ledger.job(req.name), status_code=201)

    async def jobs(self, request: Request) -> Response:
        self.who(request)
        return JSONResponse({"jobs": self.ledger.jobs()})

    async def job(self, request: Request) -> Response:
        self.who(request)
        j = self.ledger.job(request.path_params["job"])
        if j is None:
            raise Refused(404, f"no job {request.path_params['job']}")
        return JSONResponse(j)

    async def cancel(self, request: Request) -> Response:
        user = self.who(request, "operator", "user")
        j = self.owned(user, request.path_params["job"])
        if j["state"] not in ("queued", "running") or \
                not self.adm.cancel(j["job"], f"cancelled by {user.name}"):
            raise Refused(409, f"job {j['job']} is {j['state']}: nothing to cancel")
        return JSONResponse({"job": j["job"], "cancelled": True})

    async def iterations(self, request: Request) -> Response:
        """A job's recorded iterations, `[[i, t_start_ns, t_end_ns], ...]`, from `since`."""
        self.who(request)
        job = request.path_params["job"]
        if self.ledger.job(job) is None:
            raise Refused(404, f"no job {job}")
        try:
            since = int(request.query_params.get("since", "0"))
        except ValueError:
            raise Refused(400, "since: an iteration number") from None
        return JSONResponse({"job": job, "iterations": self.ledger.timeline(job, since)})

    async def logs(self, request: Request) -> Response:
        user = self.who(request, "operator", "user")
        j = self.owned(user, request.path_params["job"])
        return JSONResponse({"job": j["job"], "log": self.ledger.logs(j["job"])})

    async def status(self, request: Request) -> Response:
        self.who(request)
        states: dict[str, int] = {}
        for j in self.ledger.jobs():
            states[j["state"]] = states.get(j["state"], 0) + 1
        return JSONResponse({"testbed": self.tb.name, "rejected": self.rejected,
                             "jobs": states, "free_nodes": len(self.adm.free),
                             "invariant_violations": len(self.adm.b.monitor.violations),
                             "first_violations": self.adm.b.monitor.violations[:FIRST]})

    def app(self) -> Starlette:
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
            Route("/jobs/{job}/logs", guarded(self.logs), methods=["GET"]),
            Route("/jobs/{job}/iterations", guarded(self.iterations), methods=["GET"]),
            Route("/status", guarded(self.status), methods=["GET"]),
        ], middleware=[Middleware(http.BearerToken, tokens=self.users,
                                  refused=self._unknown)])

    def _unknown(self, why: str) -> None:
        """A request with no valid token: counted and logged, as any refusal."""
        self.rejected += 1
        log.warning("arbiter: a request refused (401): %s", why)


def serve(testbed: Path, state: Path, users: list[str], host: str = "127.0.0.1",
          port: int = 8060, tls: tuple[Path, Path] | None = None,
          say: Callable[[str], None] = print) -> None:
    """Run the service until SIGINT or SIGTERM (a clean stop keeps every job's state, as
    a crash does)."""

    if not ipaddress.ip_address(host).is_loopback and tls is None:
        raise ValueError(f"--host {host}: beyond loopback the API needs TLS (--tls-cert, "
                         f"--tls-key) or a reverse proxy in front of 127.0.0.1 "
                         f"(docs/arbiter.md)")
    tb = load_testbed(testbed)
    if not registry.serves(tb).devices:
        raise ConfigError([ConfigIssue(
            str(testbed), "testbed.backend", "the arbiter owns devices: give an emu config "
            "(`oddl emulate TESTBED --out emu.toml`) or a lab's hw config")])
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    users_by_token = tokens(state, users)
    grid = Grid.from_testbed(tb)
    with TestbedLock(registry.lock_name(tb), f"oddl arbiter (pid {os.getpid()})").acquire():
        backend = registry.open_backend(tb.testbed.backend, tb, grid)
        ledger = Ledger(state / "arbiter.sqlite")
        try:
            arbiter = Arbiter(tb, grid, backend.onics, backend.wss)
            arbiter.inventory()
            spec = NetworkSpec(name="oddl", kind="oddl")  # the testbed's, as planned

            def make(svc: Service) -> Admission:
                return Admission(backend, grid, [], Rectangles(grid, "fifo"),
                                 OddlStage1(arbiter, spec), spec, tb,
                                 job_id("arbiter", os.getpid(), time.time_ns()), "arbiter",
                                 svc.on_iteration, on_end=svc.on_end)

            svc = Service(tb, ledger, users_by_token, make)
            api = http.HttpService(svc.app(), host, port,
                                   ssl_certfile=tls[0] if tls else None,
                                   ssl_keyfile=tls[1] if tls else None)

            async def main() -> None:
                async with Services(f"arbiter of {tb.name}") as services:
                    svc.adm.open()
                    services.add("the orchestration of jobs", svc.adm.close)
                    for job, req, done in ledger.unfinished():  # what the last one left
                        ledger.set(job, "queued")
                        ledger.note(job, f"queued again by a new arbiter, from iteration "
                                         f"{done}")
                        svc.adm.submit(req, resume=done)
                    svc.tell()
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
            ledger.close()
            backend.close()

