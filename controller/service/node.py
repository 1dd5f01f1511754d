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
lost to a program still starting); a peer's "ready" heard before this program has taken
the job is kept for it. A new job replaces one still running (its controller
has gone); a peer's failure ends the job here too, naming the peer. The controller ends
one job of several on `job/stop`, and every job when its status goes "offline".

`oddl emulate` starts this same program for each emulated board, on the board model's
interrupt line; a lab starts it on each board (docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgspec
from oddl.controller.base.access import (
    CONTROLLER,
    health_topic,
    result_topic,
    results,
    run_topic,
    status_topic,
    stop_topic,
    telemetry_topic,
)
from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import Bus, InterruptLine, ONic
from oddl.controller.base.messages import Flow
from oddl.controller.base.telemetry import ports_note
from oddl.controller.base.throttle import worth_logging
from oddl.controller.service.health import Heartbeat, Heartbeats, host_id, read_heartbeat
from oddl.controller.stage2.control_unit import ControlUnit, UnitFactory
from oddl.controller.stage2.invariants import InvariantChecker
from oddl.controller.stage2.job import (
    DECODE_ERRORS,
    JOB_VERSION,
    MAX_FLOW_ROWS,
    MAX_NODES,
    EventKind,
    JobEvent,
    JobRunner,
    JobSpec,
    JobStop,
    ReportedFlow,
    from_its_node,
    nic_programs,
    refused,
    schedule_of,
    step_sync,
)
from oddl.controller.stage2.trace import TraceRow

log = logging.getLogger(__name__)
MAX_VIOLATIONS_REPORTED = 50
# peers' "ready" and "failed" events heard before this program had their job (a board
# over PYNQ.remote takes a job later than its emulated or local peers): one per node
MAX_EARLY_EVENTS = MAX_NODES
NOTE_EVERY = 10  # beats between two ports notes that say nothing new
MAX_STOPPED = 64  # ids of jobs the controller stopped, remembered (one may come late)
# a job the broker's loss cut: its last reports, said again to the controller (a broker
# takes with it the reports in flight when it goes: the ranks' last one or two)
REPORTS_SAID_AGAIN = 4
_C = TypeVar("_C", JobSpec, JobStop)  # what the controller sends a node


class NodeBus(Bus, Protocol):
    """One connection for all a node says and hears (drivers/mqtt.py `MQTTBus`): its
    control topic, the job topics, the controller's status."""

    peers: set[str] | None
    lost: asyncio.Event
    rejected: int  # junk refused, and messages that failed in their handler
    unexpected: int  # for no job of ours, or from no peer of the job

    def on(self, topic_filter: str, handler: Callable[[str, bytes], None]) -> None: ...
    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None: ...
    async def start(self) -> Any: ...
    async def reconnect(self, give_up_s: float | None = None) -> None: ...
    def abandon(self) -> None: ...
    async def close(self) -> None: ...


class PeerFailed(RuntimeError):
    pass


class NodeProgram:
    def __init__(self, testbed: str, node: str, onic: ONic, line: InterruptLine,
                 bus: NodeBus, monitor: InvariantChecker | None = None,
                 heartbeat_s: float = 0.1, unit: UnitFactory = ControlUnit) -> None:
        self.testbed = testbed
        self.unit = unit  # the control unit each job gets (an emulator may model its RTL)
        self.node = node
        self.onic = onic
        self.line = line
        self.bus = bus  # logged in as this node: it can speak only as itself
        # the testbed's monitor where there is one (an emulated fabric sees the light);
        # on hardware, this node's own view: the grants it gets, the flows it delivers
        self.monitor = monitor
        self.jobs_run = 0
        self.jobs_cancelled = 0  # their controller went away
        self.rejected = 0  # job-topic messages that were not a job or an event of ours
        self._job: _NodeJob | None = None
        self._jobs: asyncio.Queue[JobSpec] = asyncio.Queue(maxsize=1)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self.heartbeat_s = heartbeat_s  # the testbed's [monitor] heartbeat_ms
        self.beats: Heartbeats | None = None
        self._host = ""  # the loop it beats on (health.host_id), once it runs
        self.reconnects = 0
        # a job the broker's loss cut: its last reports and its "failed" event, said again
        # once the controller is heard again (the broker may have taken them unheard)
        self.said_again: list[tuple[str, bytes]] = []
        self.retries_done = 0  # REQUEST retries of the jobs this program has finished
        self._specs = msgspec.json.Decoder(JobSpec)
        self._events = msgspec.json.Decoder(JobEvent)
        self._early: deque[JobEvent] = deque(maxlen=MAX_EARLY_EVENTS)
        self._stops = msgspec.json.Decoder(JobStop)
        self.stopped: deque[str] = deque(maxlen=MAX_STOPPED)
        self._note = b""  # the last ports note said
        self.controller = "unknown"  # its status on the bus: online, offline
        self.session = ""  # the controller's session it follows (its latest "online")
        # jobs that ended here: their peers' late events are no news for a later job
        # (one sent again under the same id failed at once with the earlier's "failed")
        self.ended: deque[str] = deque(maxlen=MAX_STOPPED)

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
        """Until the program ends: by `stop`, or an error it cannot get over (a broker that
        goes away is waited for: the board idles, the bus reconnects)."""
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
        await self.bus.close()

    def busy(self) -> bool:
        """A job on this node (taken, or waiting to be)."""
        return self._job is not None or not self._jobs.empty()

    def retries(self) -> int:
        """REQUEST retries of every job so far, the running one's included."""
        job = self._job
        run = job.runner.stats().get("retries", 0) if job and job.runner else 0
        return self.retries_done + run

    async def crash(self) -> None:
        """Gone without a word, as a program is when its board loses power under it:
        no goodbye on the bus (the broker publishes its will), no heartbeat, no result."""
        self.bus.abandon()
        if self.beats is not None:
            self.beats.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _reject(self, topic: str, why: object) -> None:
        self.rejected += 1
        if worth_logging(self.rejected):
            log.warning("node %s: %s: message rejected: %s (%d so far)", self.node, topic,
                        why, self.rejected)

    def _idle(self, msg: Any) -> None:
        log.debug("node %s: %r for no job of ours dropped", self.node, msg)

    def _from_controller(self, decoder: msgspec.json.Decoder[_C], topic: str,
                         payload: bytes) -> _C | None:
        """A job or a stop, of the version this node runs; anything else is counted,
        logged and dropped (None)."""
        try:
            msg = decoder.decode(payload)
        except DECODE_ERRORS as e:
            self._reject(topic, e)
            return None
        if msg.v != JOB_VERSION:
            self._reject(topic, f"job version {msg.v}, this node runs {JOB_VERSION}")
            return None
        return msg

    def _on_run(self, topic: str, payload: bytes) -> None:
        spec = self._from_controller(self._specs, topic, payload)
        if spec is None or self.node not in spec.nodes or spec.job in self.stopped:
            return
        why = refused(spec)
        if why is not None:
            return self._reject(topic, why)
        if spec.controller < self.session:
            return self._reject(topic, f"job {spec.job} of an earlier controller")
        if spec.controller > self.session:  # a new controller, before its status came
            self._on_controller(topic, b"online " + spec.controller.encode())
        if self._jobs.full():  # a newer job replaces one not yet started
            self._jobs.get_nowait()
        self._jobs.put_nowait(spec)

    def _on_stop(self, topic: str, payload: bytes) -> None:
        stop = self._from_controller(self._stops, topic, payload)
        if stop is None:
            return
        self.stopped.append(stop.job)  # not started yet: it never will be
        job = self._job
        if job is not None and job.spec.job == stop.job and not job.finished.done():
            self.jobs_cancelled += 1
            log.warning("node %s: job %s stopped by the controller: %s", self.node,
                        stop.job, stop.why)
            job.cancel(f"stopped by the controller: {stop.why}")

    def _on_result(self, topic: str, payload: bytes) -> None:
        ev = from_its_node(self._events, topic, payload)
        if isinstance(ev, str):
            return self._reject(topic, ev)
        job = self._job
        if job is not None and job.spec.job == ev.job:
            job.on_event(ev)
        elif ev.kind in ("ready", "failed") and ev.v == JOB_VERSION \
                and ev.job not in self.ended:
            self._early.append(ev)  # for a job this program has not taken yet

    def _read_health(self, seq: int) -> Heartbeat:
        job = self._job
        return read_heartbeat(self.node, seq, self.onic, job.runner if job else None,
                              self.beats.lag_ns if self.beats is not None else 0,
                              self.bus.sent, self._host)

    def _send_health(self, hb: Heartbeat) -> None:
        if self.bus.lost.is_set():
            return
        job = self._job
        note = msgspec.json.encode(ports_note(self.node, self.onic.ports,
                                              job.runner if job else None, self.bus.sent))
        out = [(health_topic(self.testbed, self.node), msgspec.json.encode(hb))]
        # the ports when they change, and every NOTE_EVERY-th beat (every slow one) for a
        # new watcher: an idle node says little (64 of them in one emulator said 640
        # notes a second)
        slow = self.beats is not None and self.beats.slow
        if note != self._note or slow or hb.seq % NOTE_EVERY == 0:
            self._note = note
            out.append((telemetry_topic(self.testbed, self.node), note))
        for topic, payload in out:
            fut = asyncio.ensure_future(self.bus.publish(topic, payload, qos=0))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _on_controller(self, topic: str, payload: bytes) -> None:
        """The controller's status: "online SESSION" or "offline SESSION". A new session
        is a new controller: a job of an earlier one still here is a leftover, dropped
        (its state belongs to its controller); an earlier session's "offline" (its last
        will, after the new one came) is no news."""
        state, _, session = payload.decode(errors="replace").partition(" ")
        if state not in ("online", "offline"):
            return self._reject(topic, f"a status {payload[:32]!r}")
        if session < self.session or (state == "offline" and session != self.session):
            return  # an earlier controller's, said late: the one we follow is up
        self.session = session  # sessions begin with their start time: newer sort later
        self.controller = state
        if self.beats is not None:  # nobody judges silence while no controller listens
            if state == "online":
                self.beats.hurry()
            else:
                self.beats.slow = True
        job = self._job
        if state == "online" and self.said_again:
            # a job the broker's loss cut: its last reports, then what the cut iteration
            # delivered here, for its resumption (the first telling may have gone with the
            # broker, unheard); the controller takes each once
            notes, self.said_again = self.said_again, []
            fut = asyncio.ensure_future(self._say_again(notes))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        if job is None or job.finished.done():
            return
        if state == "offline":
            self.jobs_cancelled += 1
            log.warning("node %s: the controller is gone: job %s cancelled", self.node,
                        job.spec.job)
            job.cancel(CONTROLLER_GONE)
        elif job.spec.controller and job.spec.controller != session:
            self.jobs_cancelled += 1
            log.warning("node %s: another controller took the testbed over: job %s of an "
                        "earlier one dropped", self.node, job.spec.job)
            job.cancel("another controller took the testbed over")

    async def _say_again(self, notes: list[tuple[str, bytes]]) -> None:
        for topic, payload in notes:  # in order: the reports before the carry
            await self.bus.publish(topic, payload, qos=1)

    async def _serve(self) -> None:
        bus, tb = self.bus, self.testbed
        bus.attach(self.node, self._idle)
        bus.on(run_topic(tb), self._on_run)
        bus.on(stop_topic(tb), self._on_stop)
        bus.on(results(tb), self._on_result)
        bus.on(status_topic(tb, CONTROLLER), self._on_controller)
        await bus.start()
        loop = asyncio.get_running_loop()
        period = round(self.heartbeat_s * 1e9)
        self._host = host_id()  # said in every heartbeat: whose loop lag is whose
        self.beats = Heartbeats(Clock(loop), period, self._read_health, self._send_health,
                                phase_ns=zlib.crc32(self.node.encode()) % period)
        self.beats.slow = self.controller != "online"
        self.beats.start()
        self._ready.set()
        lost = asyncio.ensure_future(bus.lost.wait())
        try:
            while True:
                nxt = asyncio.ensure_future(self._jobs.get())
                await asyncio.wait({nxt, lost}, return_when="FIRST_COMPLETED")
                if lost.done():
                    nxt.cancel()
                    # the board safe while nobody can be heard: no job, so no transfer
                    # starts and no transmitter lights; then back on the broker, waiting
                    # for the next job (the controller re-sends it, or another)
                    if self._job is not None:
                        await self._job.abort(LOST_BROKER)
                    log.warning("node %s: lost the broker; the board is idle; "
                                "reconnecting", self.node)
                    await bus.reconnect()
                    self.reconnects += 1
                    lost = asyncio.ensure_future(bus.lost.wait())
                    continue
                spec = nxt.result()
                if self._job is not None:
                    await self._job.abort(f"replaced by job {spec.job}")
                self._job = _NodeJob(self, spec)
                with contextlib.suppress(ValueError):
                    self.ended.remove(spec.job)  # sent again: its peers' news is news
                early, self._early = self._early, deque(maxlen=MAX_EARLY_EVENTS)
                for ev in early:
                    if ev.job == spec.job:
                        self._job.on_event(ev)
                self._job.task = asyncio.create_task(self._job.run())
        finally:
            lost.cancel()
            if self.beats is not None:
                self.beats.stop()
            if self._job is not None:  # the board safe: no transfer started, lines given back
                await self._job.abort("the node program stopped")


# what a node says when its connection goes: a broker that went away, or (MQTT 3.1.1 tells
# no difference) one that closed this connection because another logged in as this node
LOST_BROKER = "lost its connection to the broker"
# a job cut by its controller's "offline" (its will: the controller died, or a broker that
# goes away says every party's will as it shuts down)
CONTROLLER_GONE = "its controller is gone"


class _NodeJob:
    """This node's part of one job."""

    def __init__(self, prog: NodeProgram, spec: JobSpec) -> None:
        self.prog, self.spec = prog, spec
        self.loop = asyncio.get_running_loop()
        self.ready: set[str] = set()
        self.reported: dict[int, set[str]] = {}
        self.next_done = spec.start  # the lowest iteration not every rank has reported
        self.all_ready = asyncio.Event()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.pending: set[asyncio.Future[Any]] = set()
        self.enc = msgspec.json.Encoder()
        self.task: asyncio.Task[None] | None = None
        self.runner: JobRunner | None = None
        self.junk0 = self._junk()
        self.flows: list[ReportedFlow] = []  # delivered here since the last report
        self.reports: deque[bytes] = deque(maxlen=REPORTS_SAID_AGAIN)  # the last ones said

    def _junk(self) -> dict[str, int]:
        b = self.prog.bus
        return {"rejected": b.rejected + self.prog.rejected, "unexpected": b.unexpected,
                "board_tampered": self.prog.onic.tampered}

    def sent(self) -> int:
        """Control messages this job's units have sent: on this program's bus, or (a unit in
        the board's gateware) on the board's own port."""
        return self.runner.sent() if self.runner is not None else 0

    def _publish(self, kind: EventKind, **kw: Any) -> asyncio.Future[Any]:
        prog = self.prog
        payload = self.enc.encode(JobEvent(JOB_VERSION, self.spec.job, kind, prog.node, **kw))
        if kind == "iteration":
            self.reports.append(payload)
        fut = asyncio.ensure_future(prog.bus.publish(result_topic(prog.testbed, prog.node),
                                                     payload, qos=1))
        self.pending.add(fut)
        fut.add_done_callback(self.pending.discard)
        # a job aborted with the broker gone never awaits these: their error is known
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return fut

    def _fail(self, exc: BaseException) -> None:
        if not self.finished.done():
            self.finished.set_exception(exc)

    def cancel(self, why: str) -> None:
        self._fail(RuntimeError(why))

    def on_event(self, ev: JobEvent) -> None:
        if ev.job != self.spec.job or ev.v != JOB_VERSION:
            return
        if ev.kind == "ready" and ev.node in self.spec.nodes:
            self.ready.add(ev.node)
            if len(self.ready) == len(self.spec.nodes):
                self.all_ready.set()
        elif ev.kind == "iteration" and ev.node in self.spec.ranks:
            # a rank is at most one iteration ahead of the slowest: anything else is no
            # report of this job's (and must not grow the table)
            if not self.next_done <= ev.iteration <= self.next_done + 1:
                self.prog._reject("result", f"iteration {ev.iteration} from {ev.node}, "
                                            f"expected {self.next_done} or the next")
                return
            got = self.reported.setdefault(ev.iteration, set())
            got.add(ev.node)
            while len(self.reported.get(self.next_done, ())) == len(self.spec.ranks):
                del self.reported[self.next_done]
                self.next_done += 1
                self._next(self.next_done)
        elif ev.kind == "failed" and ev.node != self.prog.node and ev.node in self.spec.nodes:
            self._fail(PeerFailed(f"node {ev.node} failed: {ev.error}"))

    def _next(self, i: int) -> None:
        if i >= self.spec.iterations:
            if not self.finished.done():
                self.finished.set_result(None)
        elif self.runner is not None and self.prog.node in self.spec.ranks:
            self.runner.begin(i)

    def _iteration(self, i: int, t_start: int, t_end: int) -> None:
        # flows so far too: a job stopped before "done" is still counted
        flows = self.runner.engine.flows if self.runner is not None else 0
        delivered, self.flows = self.flows, []
        self._publish("iteration", iteration=i, t_start=t_start, t_end=t_end,
                      control_messages=self.sent(), stats={"flows": flows},
                      trace=self._trace(), flows=delivered)

    def _delivered(self, f: Flow, t_ns: int) -> None:
        if len(self.flows) < MAX_FLOW_ROWS:
            self.flows.append((f.id, f.step, f.src, f.dst, f.nbytes, f.hop + 1, f.t_submit,
                               t_ns))

    def _trace(self) -> list[TraceRow]:
        """What the control units recorded since the last report (controller/stage2/trace.py)."""
        return self.runner.trace.drain() if self.runner and self.runner.trace else []

    async def run(self) -> None:
        prog, spec = self.prog, self.spec
        monitor = (prog.monitor if prog.monitor is not None
                   else InvariantChecker(mode="record", partial=True))
        monitor.new_job(spec.job, spec.tag, spec.nodes)
        bad_before = len(monitor.violations)
        bus = prog.bus
        runner = None
        try:
            runner = self.runner = JobRunner(spec, Clock(self.loop), monitor, self._iteration,
                                             local=[prog.node])
            runner.fail = self._fail
            if spec.record_flows:
                runner.engine.on_delivered_hook = self._delivered
            bus.peers = set(spec.nodes)
            if prog.node in spec.boards:  # the controller cannot reach this board
                self._stage1()
            runner.on_onics(bus, {prog.node: prog.onic}, {prog.node: prog.line}, prog.unit)
            await self._publish("ready")
            await self._wait(self.all_ready.wait())
            if prog.node in spec.ranks:
                runner.begin(spec.start)
            await self._wait(self.finished)
            for _ in range(1000):  # the last RELEASEs leave after the last TX_DONE (bounded)
                if not runner.transmitting():
                    break
                await asyncio.sleep(0.001)
            await asyncio.gather(*self.pending)
            junk = {k: v - self.junk0[k] for k, v in self._junk().items()}
            if spec.tag:  # beside others: its books close as it leaves
                monitor.job_left(spec.tag, runner.clock.now_ns())
            # its own; a testbed's monitor (an emulator's) also sees others' jobs, perhaps
            # leftovers of a controller gone: theirs are counted apart, never as its own
            bad = monitor.of_job(spec.job, bad_before)
            elsewhere = len(monitor.violations) - bad_before - len(bad)
            await self._publish("done", control_messages=self.sent(),
                                stats={**runner.stats(), **junk, "flows": runner.engine.flows,
                                       "violations": len(bad)}
                                | ({"violations_of_other_jobs": elsewhere} if elsewhere else {}),
                                violations=bad[:MAX_VIOLATIONS_REPORTED], trace=self._trace())
            prog.jobs_run += 1
            log.info("node %s: job %s done (%s step sync)", prog.node, spec.job,
                     step_sync(spec))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the controller and the peers hear why; the node serves on
            log.warning("node %s: job %s failed: %s", prog.node, spec.job, e)
            # what the iteration in flight delivered here, for its resumption; once this
            # rank's part of it is done (reported: the peers that heard every report have
            # gone on, whether or not it has heard them all), what came early of the next
            more: dict[str, Any] = {}
            if runner is not None and prog.node in spec.ranks and runner.engine.iteration >= 0:
                eng = runner.engine
                if (carry := eng.carry_of(eng.iteration)) is not None:
                    more = {"iteration": eng.iteration, "carried": True,
                            "carry_t0": carry[0], "carry": carry[1]}
                if eng.pending == 0 and (early := eng.carry_of(eng.iteration + 1)):
                    more |= {"done_here": True, "early_t0": early[0], "early": early[1]}
            if runner is not None:  # its counters: the record of a job cut short
                more |= {"control_messages": self.sent(),
                         "stats": {**runner.stats(), "flows": runner.engine.flows}}
            again = str(e) in (LOST_BROKER, CONTROLLER_GONE)
            if again:  # said again once the controller is back, after its last reports (a
                # broker that went took what was said with it)
                topic = result_topic(prog.testbed, prog.node)
                prog.said_again = [(topic, r) for r in self.reports] + [
                    (topic, self.enc.encode(JobEvent(JOB_VERSION, spec.job, "failed",
                                                     prog.node, error=str(e), again=2,
                                                     **more)))]
            with contextlib.suppress(Exception):
                await self._publish("failed", error=str(e)[:4096], again=int(again), **more)
        finally:
            if runner is not None:
                prog.retries_done += runner.stats().get("retries", 0)
                runner.close()
            if spec.tag and not (self.finished.done() and not self.finished.cancelled()
                                 and self.finished.exception() is None):
                monitor.job_cut(spec.tag)  # cut short: its books go with it
            if prog.node in spec.boards:  # its light is gone with the job's routes
                with contextlib.suppress(Exception):
                    prog.onic.load_routes({})
            bus.attach(prog.node, prog._idle)
            bus.peers = None
            prog.ended.append(spec.job)
            prog._early = deque((e for e in prog._early if e.job != spec.job),
                                maxlen=MAX_EARLY_EVENTS)
            if prog._job is self:
                prog._job = None

    def _stage1(self) -> None:
        """This board's part of stage 1, which the controller cannot write itself: its
        routes and its count-action program, from the job; read back before "ready"."""
        node, onic, spec = self.prog.node, self.prog.onic, self.spec
        routes = dict(spec.routes.get(node, {}))
        onic.load_routes(routes)
        programs = nic_programs(schedule_of(spec), spec.ranks) if spec.nic_sync else None
        program = programs.get(node) if programs else None
        if program is not None:
            onic.load_countaction(program)
        back = onic.read_routes()
        if back != routes:
            bad = [d for d in routes if back.get(d) != routes[d]][:3]
            raise RuntimeError(f"board {node}: routes differ on read-back, e.g. {bad}")
        if program is not None and onic.read_countaction().modules != program.modules:
            raise RuntimeError(f"board {node}: count-action program differs on read-back")

    async def _wait(self, aw: Any) -> None:
        """Wait for `aw`, unless the job fails first."""
        t = asyncio.ensure_future(aw)
        await asyncio.wait({t, self.finished}, return_when="FIRST_COMPLETED")
        if self.finished.done() and self.finished.exception() is not None:
            t.cancel()
            raise self.finished.exception()  # type: ignore[misc]  # not None: checked above
        await t

    async def abort(self, why: str | None) -> None:
        if why is not None:
            self._fail(RuntimeError(why))
        if self.task is not None and not self.task.done():
            if why is None:
                self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
