"""`oddl node`: stage 2 beside one O-NIC, as ODDL puts it.

The program owns one node's control units. It reaches its board through the O-NIC driver
(local pynq MMIO on the board's own processor, PYNQ.remote from the node's host), takes
the board's interrupt line, and speaks to its peers only in control messages on the bus.
It waits for jobs from the controller, runs its part of each with the one `JobRunner`,
and reports every iteration as its ranks finish it.

Iterations are kept in step by the reports themselves: every node program hears every
node's "iteration" event on the result topic, and a rank begins iteration i + 1 when every
rank has reported i (in process, the sim back end does the same at once). A job starts
when every node of it has said "ready" (subscribed to its control topic, so no REQUEST is
lost to a program still starting). A new job replaces one still running (its controller
has gone); a peer's failure ends the job here too, naming the peer.

`oddl emulate` starts this same program for each emulated board, on the board model's
interrupt line; a lab starts it on each board (docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import msgspec
from oddl.controller.clock import Clock
from oddl.controller.devices import Bus, InterruptLine, ONic
from oddl.controller.invariants import InvariantChecker
from oddl.controller.job import (
    JOB_VERSION,
    JobEvent,
    JobRunner,
    JobSpec,
    result_topic,
    run_topic,
    step_sync,
)

log = logging.getLogger(__name__)
MAX_VIOLATIONS_REPORTED = 50


class JobChannel(Protocol):
    """The job topics' client (aiomqtt's `Client` has this shape)."""

    async def __aenter__(self) -> Any: ...
    async def __aexit__(self, *exc: object) -> Any: ...
    async def subscribe(self, topic: str, qos: int = 0) -> Any: ...
    async def publish(self, topic: str, payload: bytes, qos: int = 0) -> Any: ...
    @property
    def messages(self) -> AsyncIterator[Any]: ...


class StartedBus(Bus, Protocol):
    async def start(self) -> Any: ...
    async def close(self) -> None: ...


class PeerFailed(RuntimeError):
    pass


class NodeProgram:
    def __init__(self, testbed: str, node: str, onic: ONic, line: InterruptLine,
                 channel: Callable[[], JobChannel], bus: Callable[[], StartedBus],
                 monitor: InvariantChecker | None = None) -> None:
        self.testbed = testbed
        self.node = node
        self.onic = onic
        self.line = line
        self.channel = channel  # () -> a connected-on-enter client of the job topics
        self.bus = bus  # () -> the control bus, speaking as this node
        # the testbed's monitor where there is one (an emulated fabric sees the light);
        # on hardware, this node's own view: the grants it gets, the flows it delivers
        self.monitor = monitor
        self.jobs_run = 0
        self.rejected = 0  # job-topic messages that were not a job or an event of ours
        self._job: _NodeJob | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> NodeProgram:
        self._task = asyncio.create_task(self._serve(), name=f"oddl-node-{self.node}")
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait({ready, self._task}, timeout=10, return_when="FIRST_COMPLETED")
        ready.cancel()
        if self._task.done():
            self._task.result()  # raises why it could not start
        if not self._ready.is_set():
            raise TimeoutError(f"node {self.node}: no job channel within 10 s")
        return self

    async def wait(self) -> None:
        """Until the program ends: only by `stop`, or by an error (the broker went away)."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        if self._job is not None:
            await self._job.abort(None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _serve(self) -> None:
        specs = msgspec.json.Decoder(JobSpec)
        events = msgspec.json.Decoder(JobEvent)
        run, result = run_topic(self.testbed), result_topic(self.testbed)
        async with self.channel() as ch:
            await ch.subscribe(run, qos=1)
            await ch.subscribe(result, qos=1)
            self._ready.set()
            async for m in ch.messages:
                topic = str(m.topic)
                try:
                    if topic == run:
                        spec = specs.decode(bytes(m.payload))
                        if spec.v != JOB_VERSION:
                            raise ValueError(f"job version {spec.v}, this node runs "
                                             f"{JOB_VERSION}")
                        if self.node not in spec.nodes:
                            continue
                        if self._job is not None:
                            await self._job.abort(f"replaced by job {spec.job}")
                        self._job = _NodeJob(self, spec, ch)
                        self._job.task = asyncio.create_task(self._job.run())
                    elif topic == result and self._job is not None:
                        self._job.on_event(events.decode(bytes(m.payload)))
                except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
                    self.rejected += 1
                    log.warning("node %s: %s: message rejected: %s", self.node, topic, e)


class _NodeJob:
    """This node's part of one job."""

    def __init__(self, prog: NodeProgram, spec: JobSpec, ch: JobChannel) -> None:
        self.prog, self.spec, self.ch = prog, spec, ch
        self.loop = asyncio.get_running_loop()
        self.ready: set[str] = set()
        self.reported: dict[int, set[str]] = {}
        self.all_ready = asyncio.Event()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.pending: set[asyncio.Future[Any]] = set()
        self.enc = msgspec.json.Encoder()
        self.task: asyncio.Task[None] | None = None
        self.runner: JobRunner | None = None
        self.sent = lambda: 0

    def _publish(self, kind: str, **kw: Any) -> asyncio.Future[Any]:
        ev = JobEvent(JOB_VERSION, self.spec.job, kind, self.prog.node, **kw)
        fut = asyncio.ensure_future(self.ch.publish(result_topic(self.prog.testbed),
                                                    self.enc.encode(ev), qos=1))
        self.pending.add(fut)
        fut.add_done_callback(self.pending.discard)
        return fut

    def _fail(self, exc: BaseException) -> None:
        if not self.finished.done():
            self.finished.set_exception(exc)

    def on_event(self, ev: JobEvent) -> None:
        if ev.job != self.spec.job or ev.v != JOB_VERSION:
            return
        if ev.kind == "ready" and ev.node in self.spec.nodes:
            self.ready.add(ev.node)
            if len(self.ready) == len(self.spec.nodes):
                self.all_ready.set()
        elif ev.kind == "iteration" and ev.node in self.spec.ranks:
            got = self.reported.setdefault(ev.iteration, set())
            got.add(ev.node)
            if len(got) == len(self.spec.ranks):
                del self.reported[ev.iteration]
                self._next(ev.iteration + 1)
        elif ev.kind == "failed" and ev.node != self.prog.node:
            self._fail(PeerFailed(f"node {ev.node} failed: {ev.error}"))

    def _next(self, i: int) -> None:
        if i >= self.spec.iterations:
            if not self.finished.done():
                self.finished.set_result(None)
        elif self.runner is not None and self.prog.node in self.spec.ranks:
            self.runner.begin(i)

    def _iteration(self, i: int, t_start: int, t_end: int) -> None:
        self._publish("iteration", iteration=i, t_start=t_start, t_end=t_end,
                      control_messages=self.sent())

    async def run(self) -> None:
        prog, spec = self.prog, self.spec
        monitor = (prog.monitor if prog.monitor is not None
                   else InvariantChecker(mode="record", partial=True))
        monitor.new_job(spec.job)
        bad_before = len(monitor.violations)
        bus = prog.bus()
        self.sent = lambda: bus.sent
        runner = None
        try:
            runner = self.runner = JobRunner(spec, Clock(self.loop), monitor, self._iteration,
                                             local=[prog.node])
            runner.fail = self._fail
            runner.on_onics(bus, {prog.node: prog.onic}, {prog.node: prog.line})
            await bus.start()
            await self._publish("ready")
            await self._wait(self.all_ready.wait())
            if prog.node in spec.ranks:
                runner.begin(0)
            await self._wait(self.finished)
            for _ in range(1000):  # the last RELEASEs leave after the last TX_DONE (bounded)
                if not runner.transmitting():
                    break
                await asyncio.sleep(0.001)
            await asyncio.gather(*self.pending)
            bad = monitor.violations[bad_before:]
            await self._publish("done", control_messages=bus.sent,
                                stats={**runner.stats(), "flows": runner.engine.flows,
                                       "violations": len(bad)},
                                violations=bad[:MAX_VIOLATIONS_REPORTED])
            prog.jobs_run += 1
            log.info("node %s: job %s done (%s step sync)", prog.node, spec.job,
                     step_sync(spec))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the controller and the peers hear why; the node serves on
            log.warning("node %s: job %s failed: %s", prog.node, spec.job, e)
            with contextlib.suppress(Exception):
                await self._publish("failed", error=str(e))
        finally:
            if runner is not None:
                runner.close()
            await bus.close()
            if prog._job is self:
                prog._job = None

    async def _wait(self, aw: Any) -> None:
        """Wait for `aw`, unless the job fails first."""
        t = asyncio.ensure_future(aw)
        await asyncio.wait({t, self.finished}, return_when="FIRST_COMPLETED")
        if self.finished.done() and self.finished.exception() is not None:
            t.cancel()
            raise self.finished.exception()  # type: ignore[misc]
        await t

    async def abort(self, why: str | None) -> None:
        if why is not None:
            self._fail(RuntimeError(why))
        if self.task is not None and not self.task.done():
            if why is None:
                self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
