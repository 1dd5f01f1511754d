"""The emu and hw back ends: a testbed's devices through the drivers a lab runs.

The controller opens every board at `grpc://HOST:PORT` (PYNQ.remote) to apply stage 1 and
read it back; a board that is `local` (its node program's alone, no port open) gets its
stage 1 from its node program, with the job (drivers/local_board.py). It opens each WSS
over its serial port, and hands jobs to the node
programs beside the boards over MQTT (`oddl node`; `oddl emulate` runs them for its
emulated boards). It never touches a per-flow register: the nodes report iterations, and
the controller records them.

The controller keeps one connection to the broker for the whole run, as `oddl-ctl`: jobs
out, results, heartbeats and the nodes' statuses (their last wills) in. Several jobs may
be out at once, on disjoint nodes (controller/service/admission.py); each result goes to its own
job. The heartbeats and wills feed the arbiter's `Health` (controller/service/health.py), as they
do in sim. When it finds a fault, the job is stopped (`job/stop`: its node programs drop
it at once) at the next recorded iteration, or after `missed` periods if none comes; the
runner re-plans and publishes the job again from the first iteration not recorded. The nodes
begin iteration i + 1 the moment every rank has reported i, so a stop here always cuts the
iteration they are in: it runs again in full. A lost broker cuts the job too; the
connection comes back with back-off, and the next job waits up to `[monitor] grace_ms`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
import msgspec
from oddl.controller.base.access import (
    CONTROLLER,
    health_topic,
    results,
    run_topic,
    status_topic,
    stop_topic,
)
from oddl.controller.base.clock import Clock
from oddl.controller.base.config import FaultSpec, Testbed
from oddl.controller.base.devices import ONic
from oddl.controller.base.telemetry import note_topic
from oddl.controller.base.throttle import worth_logging
from oddl.controller.base.topology import Grid
from oddl.controller.service.backend import (
    JobOutcome,
    JobStopped,
    OnIteration,
    RunFailed,
    StopRule,
)
from oddl.controller.service.health import Health, Heartbeat
from oddl.controller.service.node import LOST_BROKER
from oddl.controller.serving.lifecycle import close_loop
from oddl.controller.stage2.invariants import InvariantChecker
from oddl.controller.stage2.job import (
    JOB_VERSION,
    JobEvent,
    JobSpec,
    JobStop,
    from_its_node,
    quiet_ns,
    schedule_of,
    step_sync,
)
from oddl.drivers import cassette
from oddl.drivers.drill import RemoteDrill
from oddl.drivers.job_tally import Carrying, JobTally
from oddl.drivers.local_board import LocalBoard
from oddl.drivers.mqtt import BusError, MQTTBus, bus_from_config
from oddl.drivers.onic import DriverONic, ONicDriver, open_onic
from oddl.drivers.wss import WSSDriver, open_wss
from oddl.fpga import regmap as R
from oddl.fpga.overlay import BITFILE, TOP_BITFILE

T = TypeVar("T")
DEVICE_THREADS = 16  # stage 1's device calls at once (fan_out)
log = logging.getLogger(__name__)
READY_MIN_S = 3.0
MAX_EVENTS = 1 << 16  # results of one job waiting to be read (a peer can send no more)
CONTROLLER_KEEPALIVE_S = 10  # a hung controller is given up 15 s on
PAUSED_S = 1.0  # a turn of the job's wait this much late: the controller was not running
MAX_CARRYING = 16  # stopped jobs whose ranks may still say what they delivered


def ready_within_s(spec: JobSpec) -> float:
    """How long node programs may take to say "ready": a flow's whole retry budget, which
    is what a silent peer would cost anyway (at least a few seconds)."""
    t = spec.timing
    return max(READY_MIN_S, t.request_timeout_ns * (t.max_retries + 1) / 1e9)


class Unreachable(RuntimeError):
    """A board the config names that cannot be reached (the message says why)."""


def overlay_of(tb: Testbed) -> Path:
    """The overlay a testbed's boards run: an onic_top's where its control units are the
    boards' (`control_model = "board"`: an emulator's onic_top boards, or a lab's build of
    onic_top put in its place), else onic_ctrl's. Its .hwh's IP says which design the
    driver then expects (drivers/onic.py)."""
    return TOP_BITFILE if tb.testbed.control_model == "board" else BITFILE


def open_board(addr: str | None, node: str, nodes: list[str], bitfile: Path = BITFILE
               ) -> ONicDriver:
    """An ONicDriver on a board address: grpc://HOST:PORT (PYNQ.remote), `local` (this
    host's PL) or serial:PORT[?baud=B] (an ECP5 board's serial bridge: no overlay file,
    the identity block says onic_top). Its overlay's .hwh is held to the register map and
    the board's identity block to the design version (`open_onic`); the bitstream is the
    board's own."""
    dev = f"board:{node}"

    def play(player: cassette.Player) -> ONicDriver:  # replayed: no device, its record
        drv = ONicDriver(player.mmio(dev), node, nodes)
        drv.check_identity()
        return drv

    def open_() -> ONicDriver:
        if addr and addr.startswith("grpc://"):
            from pynq.pl_server.remote_device import RemoteDevice

            host, _, port = addr.removeprefix("grpc://").rpartition(":")
            device = RemoteDevice(0, host, port=int(port))
            return open_onic(bitfile, device, node, nodes, download=False,
                             tap=lambda m: cassette.tap_mmio(
                                 dev, RemoteMMIO(m, f"board {node} ({addr})")))
        if addr == "local":
            from pynq import Device

            return open_onic(bitfile, Device.active_device, node, nodes, download=False,
                             tap=lambda m: cassette.tap_mmio(dev, m))
        if addr and addr.startswith("serial:"):  # an ECP5 board's onic_top, over its UART
            from oddl.drivers.serial_board import open_window

            try:
                drv = ONicDriver(cassette.tap_mmio(dev, open_window(addr, f"board {node}")),
                                 node, nodes)
                drv.design = R.TOP_DESIGN_VERSION
                drv.check_identity(drv.design)
            except (ConnectionError, ValueError) as e:
                raise Unreachable(str(e)) from None
            return drv
        raise Unreachable(f"board address {addr!r} is neither grpc://HOST:PORT, "
                          f"serial:PORT[?baud=B] nor 'local'")

    return cassette.opened(dev, open_, play)


class RemoteMMIO:
    """pynq MMIO over PYNQ.remote, whose lost connection is a `ConnectionError` naming
    the board (what a device that fails raises: stage 1 then goes round it), not gRPC's
    own error type."""

    def __init__(self, mmio: Any, where: str) -> None:
        self._mmio, self.where = mmio, where

    def read(self, offset: int = 0, length: int = 4, word_order: str = "little") -> int:
        try:
            return int(self._mmio.read(offset, length))
        except grpc.RpcError as e:
            raise ConnectionError(f"{self.where}: {_rpc_error(e)}") from None

    def write(self, offset: int, data: int | bytes) -> None:
        try:
            self._mmio.write(offset, data)
        except grpc.RpcError as e:
            raise ConnectionError(f"{self.where}: {_rpc_error(e)}") from None


def _rpc_error(e: grpc.RpcError) -> str:
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    return f"{code().name}: {details()}" if callable(code) and callable(details) else str(e)


def ports_of(grid: Grid, node: str) -> tuple[str, ...]:
    return tuple(p for p in R.PORTS if grid.group_of(node, p).wss)


class LabBackend:
    """Real devices (hw) or `oddl emulate`'s (emu): the same code, other addresses."""

    def __init__(self, tb: Testbed, grid: Grid, name: str = "hw",
                 checker_mode: str = "record", faults: list[FaultSpec] | None = None) -> None:
        self.name = name
        self.tb = tb
        self.loop = asyncio.new_event_loop()
        self.clock = Clock(self.loop)
        # the controller's view: what the nodes report (the light is the devices' business,
        # and where a fabric model exists, the emulator's own monitor judges it)
        self.monitor = InvariantChecker(mode=checker_mode)
        self.rejected = 0  # result, health and status messages that were none of ours
        self.health = Health.of(tb, grid)
        self.drill = RemoteDrill(tb.emulator, faults or [], self.clock)
        self._pool: ThreadPoolExecutor | None = None  # stage 1's device calls (fan_out)
        self._stage1: ThreadPoolExecutor | None = None  # stage 1 itself, off the loop
        self.injected = self.drill.injected
        self.cut: dict[str, JobOutcome] = {}  # each cancelled job's (`Backend.cut`)
        self.bus: MQTTBus | None = None
        # this controller's life on the bus, said with its status and in its jobs: the
        # nodes drop jobs of the ones before it (their start time first: newer sorts later)
        self.session = cassette.value("controller session",
                                      lambda: f"{time.time_ns():020d}-{os.getpid()}")
        self._connecting = asyncio.Lock()
        self._heard: set[str] = set()  # nodes heard from: their "offline" is a last will
        self._beating: set[str] = set()  # nodes heard on this connection (since the broker)
        self._connection = 0  # connections lost so far
        self.paused = (0.0, 0.0)  # the controller's last pause: (ended, seconds; monotonic)
        self._carrying: dict[str, Carrying] = {}  # stopped jobs whose carry is gathered
        self._moving: dict[str, float] = {}  # job out -> when its nodes last said they talk
        # the jobs out, by id: each its spec and its results, waiting to be read (None:
        # the broker went away)
        self._out: dict[str, tuple[JobSpec, asyncio.Queue[JobEvent | None]]] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._following: set[asyncio.Task[Any]] = set()  # the tasks that wait on jobs out
        self._notes: collections.deque[tuple[str, bytes, bool]] = collections.deque(maxlen=64)
        self._decode_event = msgspec.json.Decoder(JobEvent)
        self._decode_beat = msgspec.json.Decoder(Heartbeat)
        nodes = list(grid.nodes)
        addr = {n.id: n.board for n in tb.nodes}
        self.onics: dict[str, ONic] = {}
        self.local: set[str] = set()  # boards only their node programs touch
        self.wss: dict[str, WSSDriver] = {}
        try:
            self._open(grid, nodes, addr)
            self._take_over()
        except BaseException:
            self.close()
            raise

    def _open(self, grid: Grid, nodes: list[str], addr: Mapping[str, str | None]) -> None:
        """Every board at once (each its own PYNQ.remote connection, in a thread), then
        every WSS's serial port; every failure gathered and named in one error."""
        remote = [n for n in nodes if addr[n] != "local"]
        for n in nodes:
            if addr[n] == "local":  # its node program's alone: stage 1 goes through it
                self.onics[n] = LocalBoard(n, ports_of(grid, n), self.health)
                self.local.add(n)

        overlay = overlay_of(self.tb)

        async def boards() -> list[ONicDriver | BaseException]:
            return await asyncio.gather(*(asyncio.to_thread(open_board, addr[n], n, nodes,
                                                            overlay)
                                          for n in remote), return_exceptions=True)

        failed = []
        for n, drv in zip(remote, self.loop.run_until_complete(boards()), strict=True):
            if isinstance(drv, BaseException):
                failed.append(f"board {n} ({addr[n]}): {drv}")
            else:
                self.onics[n] = DriverONic(drv, ports_of(grid, n))
        for w in self.tb.wss:
            try:
                if not w.serial:
                    raise Unreachable("no serial port in the testbed config")
                self.wss[w.id] = open_wss(w.id, w.serial, settle_s=w.reconfig_ms / 1e3)
            except Exception as e:
                failed.append(f"WSS {w.id} ({w.serial}): {e}")
        if failed:
            raise RunFailed(f"{len(failed)} of the testbed's devices cannot be opened:\n  "
                            + "\n  ".join(failed))

    def _take_over(self) -> None:
        """The testbed as this controller finds it, made its own: an earlier controller's
        WSS rows and board routes (a killed run's, an arbiter's) cleared, so that nothing
        of its jobs lights a path, and what this one reads back is what it wrote. (Its
        node programs drop its jobs themselves: our session is newer.)"""
        for w in self.wss.values():
            w.set_table([[None] * w.channels for _ in range(w.ports)])
        for n, onic in self.onics.items():
            if n not in self.local:
                onic.load_routes({})

    # --- the controller's connection ---------------------------------------------------
    async def _connect(self) -> MQTTBus:
        """The one connection, opened at the first job; after a lost broker, back within
        `grace_ms` or the run stops."""
        tb = self.tb.name
        async with self._connecting:  # jobs that start together open it once
            if self.bus is None:
                # the nodes cancel every job when our status goes "offline": a clean exit,
                # a crash (the will), or (keepalive) a controller that hangs
                bus = bus_from_config(tb, self.tb.broker, CONTROLLER,
                                      keepalive=CONTROLLER_KEEPALIVE_S, session=self.session)
                bus.on(health_topic(tb, "+"), self._on_health)
                bus.on(status_topic(tb, "+"), self._on_status)
                bus.on(results(tb), self._on_result)
                try:
                    await bus.start()
                except BusError as e:
                    raise RunFailed(str(e)) from None
                self.bus = bus
                while self._notes:  # what was said before there was a connection (stage 1)
                    topic, payload, retain = self._notes.popleft()
                    self._publish_note(topic, payload, retain)
                self.health.start(self.clock.now_ns())
                self._keeper = asyncio.ensure_future(self._keep(bus))
        grace = self.tb.monitor.grace_ms / 1e3
        t_end = time.monotonic() + grace
        while self.bus.lost.is_set():
            if time.monotonic() > t_end:
                raise RunFailed(f"the broker did not come back within grace_ms = "
                                f"{self.tb.monitor.grace_ms:g}")
            await asyncio.sleep(self.health.tick_ns / 1e9)
        return self.bus

    def announce(self, kind: str, payload: bytes) -> None:
        """A note for the testbed's watchers (controller/base/telemetry.py), on our connection
        (kept for it, the last 64, until there is one)."""
        topic, retain = note_topic(self.tb.name, kind)
        if self.bus is not None and self.loop.is_running() and not self.bus.lost.is_set():
            self._publish_note(topic, payload, retain)
        else:
            self._notes.append((topic, payload, retain))

    def _publish_note(self, topic: str, payload: bytes, retain: bool) -> None:
        assert self.bus is not None
        # (a retained note, kept for those who were not listening, at least once)
        fut = asyncio.ensure_future(self.bus.publish(topic, payload, qos=int(retain),
                                                     retain=retain))
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _heard_from(self, spec: JobSpec) -> None:
        """Until every node of the job beats on this connection (so it is on the broker,
        subscribed, and will hear the job) or the watch finds it dead; `grace_ms` at most."""
        t_end = time.monotonic() + self.tb.monitor.grace_ms / 1e3
        while time.monotonic() < t_end and any(
                n not in self._beating and not self.health.is_dead(n) for n in spec.nodes):
            await asyncio.sleep(self.health.tick_ns / 1e9)

    async def _keep(self, bus: MQTTBus) -> None:
        """A lost broker cuts the job (the nodes drop it too); reconnect with back-off."""
        while True:
            await bus.lost.wait()
            self._connection += 1
            self._beating.clear()
            self.health.bus_lost(self.clock.now_ns(), "the controller lost its connection")
            log.warning("controller: lost the broker; reconnecting")
            for _spec, events in self._out.values():
                with contextlib.suppress(asyncio.QueueFull):
                    events.put_nowait(None)
            await bus.reconnect()

    def _on_health(self, topic: str, payload: bytes) -> None:
        hb = from_its_node(self._decode_beat, topic, payload)
        if isinstance(hb, str):
            return self._reject(topic, hb)
        self._heard.add(hb.node)
        self._beating.add(hb.node)
        prev = self.health.nodes[hb.node].beat if hb.node in self.health.nodes else None
        if hb.job in self._out and prev is not None and hb.sent > prev.sent:
            self._moving[hb.job] = time.monotonic()  # its control units talk: it moves
        self.health.beat(hb, self.clock.now_ns())

    def _on_status(self, topic: str, payload: bytes) -> None:
        party = topic.rpartition("/")[2]
        payload = payload.partition(b" ")[0]  # a party's session, if it says one
        if payload == b"online":
            self._heard.add(party)
        elif payload == b"offline" and party in self._heard:  # a retained one of a node
            # never heard is named by the watch; a will that comes as our own connection
            # goes is the broker shutting down, not the node (amqtt publishes them so)
            self.clock.call_later_ns(self.health.tick_ns, self._will, party,
                                     self._connection, self.clock.now_ns())

    def _will(self, node: str, connection: int, t_ns: int) -> None:
        if connection == self._connection and self.bus is not None \
                and not self.bus.lost.is_set():
            self.health.will(node, t_ns)

    def _on_result(self, topic: str, payload: bytes) -> None:
        """A result of a job out, from a node of that job on its own topic, to that job;
        anything else is counted, logged and dropped (a stopped job's stragglers quietly)."""
        ev = from_its_node(self._decode_event, topic, payload)
        if isinstance(ev, str):
            return self._reject(topic, ev)
        carrying = self._carrying.get(ev.job)
        if carrying is not None:
            carrying.heard(ev)
        out = self._out.get(ev.job)
        if out is None:
            return
        spec, events = out
        if ev.node not in spec.nodes:
            return self._reject(topic, f"an event of {ev.node!r}, no node of job {ev.job}")
        try:
            events.put_nowait(ev)
        except asyncio.QueueFull:
            self._reject(topic, f"more than {MAX_EVENTS} results of job {ev.job} waiting")

    # --- a job -------------------------------------------------------------------------
    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool, stop: StopRule, extend: bool = False
                      ) -> JobOutcome:
        """Publish the job; record each iteration once every rank has reported it; stop
        it when the watch finds a fault. A job of which nothing is heard for an iteration's
        compute plus `grace_ms`, its nodes alive, is stuck: the run fails, naming whom it
        waits for. Every iteration runs (`extend` is for the models)."""
        spec = msgspec.structs.replace(spec, controller=self.session)
        if self.local & set(spec.nodes):  # their node programs apply their stage 1
            spec = msgspec.structs.replace(spec, boards=sorted(self.local & set(spec.nodes)))
        bus = await self._connect()
        self.drill.arm()
        rejected0 = self.rejected
        tally = JobTally(spec, on_iteration, lambda why: self._reject("result", why))
        if spec.job in self._out:
            raise RunFailed(f"job {spec.job} is already out")
        events: asyncio.Queue[JobEvent | None] = asyncio.Queue(MAX_EVENTS)
        await self._heard_from(spec)
        self._out[spec.job] = (spec, events)
        if (me := asyncio.current_task()) is not None:
            self._following.add(me)
        ended, cancelled = False, False
        try:
            tally.published()  # before: a QoS 1 publish returns once acknowledged
            await bus.publish(run_topic(self.tb.name), msgspec.json.encode(spec), qos=1)
            self.drill.at_iteration(spec.start)
            await self._follow(tally, events, stop, rejected0)
            ended = True
        except asyncio.CancelledError:  # the service cancels it: its nodes go to the next
            cancelled = True
            raise
        except JobStopped as e:
            if e.lost and not any(self.health.is_dead(n) for n in spec.ranks):
                # what the cut iteration delivered: each rank's node program says, in its
                # "failed" event, now, or (the broker gone) once it hears us again, after
                # its last reports (the broker may have taken them unheard)
                c = self._carrying[spec.job] = Carrying(
                    e, tally, {n: r for r, n in enumerate(spec.ranks)}, schedule_of(spec),
                    lambda why: self._reject("result", why))
                queued: list[JobEvent] = []
                while not events.empty():  # heard, not yet tallied (a late loop)
                    if (ev := events.get_nowait()) is not None:
                        queued.append(ev)
                c.heard_queued(queued)
                e.carrying = c.done
                while len(self._carrying) > MAX_CARRYING:
                    del self._carrying[next(iter(self._carrying))]
                if not bus.lost.is_set():
                    ended = await self._halt(spec, None)  # the stop is out (the stop waits)
            raise
        finally:
            if not ended and not bus.lost.is_set():  # its node programs drop it at once
                heard: dict[str, JobEvent] = dict(tally.done)
                await self._halt(spec, events if cancelled else None, set(tally.done) | {
                    n for n in spec.nodes if self.health.is_dead(n)}, heard)
                if cancelled:  # its record: what its ranks said as they dropped it
                    cut = self._outcome(spec, heard, self.rejected - rejected0)
                    cut.control_messages = max(cut.control_messages, sum(tally.sent.values()))
                    cut.flows = max(cut.flows, sum(tally.flows.values()))  # (one silent)
                    self.cut[spec.job] = cut
                    while len(self.cut) > MAX_CARRYING:
                        del self.cut[next(iter(self.cut))]
            del self._out[spec.job]
            self._moving.pop(spec.job, None)
            self._following.discard(asyncio.current_task())
        out = self._outcome(spec, tally.done, self.rejected - rejected0)
        out.trace = tally.trace
        return out

    async def _halt(self, spec: JobSpec, events: asyncio.Queue[JobEvent | None] | None,
                    gone: set[str] | frozenset[str] = frozenset(),
                    heard: dict[str, JobEvent] | None = None) -> bool:
        """Tell a job's node programs to drop it (`job/stop`); with its `events` (a job the
        service cancelled), wait until each (but those `gone`) says it has ("failed" or
        "done"), `grace_ms` at most: it gives its nodes to the next only once they have
        stopped starting flows. A job stopped for a fault waits in the orchestration's
        stop instead. True once the stop is out."""
        assert self.bus is not None
        halt = JobStop(JOB_VERSION, spec.job, "its run stopped")
        with contextlib.suppress(BusError):
            await self.bus.publish(stop_topic(self.tb.name), msgspec.json.encode(halt), qos=1)
        left = set(spec.nodes) - gone if events is not None else set()
        t_end = time.monotonic() + self.tb.monitor.grace_ms / 1e3
        while events is not None and left and (wait := t_end - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(wait):
                    ev = await events.get()
            except TimeoutError:
                break
            if ev is None:  # the broker lost: whoever is still on it hears the stop later
                break
            if ev.kind in ("failed", "done") and ev.job == spec.job:
                left.discard(ev.node)
                if heard is not None:
                    heard[ev.node] = ev
        if left:
            log.warning("job %s: no word from %s that it dropped the job within grace_ms; "
                        "its nodes are given back all the same", spec.job,
                        ", ".join(sorted(left)))
        return True

    async def _follow(self, tally: JobTally, events: asyncio.Queue[JobEvent | None],
                      stop: StopRule, rejected0: int) -> None:
        """Wait for a published job's events until each of its nodes is done; raises
        JobStopped when the watch cuts it, RunFailed when it cannot go on."""
        spec = tally.spec
        stall_s = quiet_ns(spec) / 1e9 + self.tb.monitor.grace_ms / 1e3
        tick = self.health.tick_ns / 1e9
        ready_s = ready_within_s(spec)
        t_ready = time.monotonic() + ready_s
        t_heard = time.monotonic()  # the last news of the job: a rank ready, reporting, done
        mark = 0
        t_turn = time.monotonic()

        def stopped(why: str) -> JobStopped:
            return JobStopped(
                f"iteration {tally.next_iteration} cut short: {why}", tally.next_iteration,
                True, JobOutcome(sum(tally.sent.values()), sum(tally.flows.values()),
                                 {"rejected": self.rejected - rejected0}, []))

        while not tally.finished:
            now = time.monotonic()
            if now - t_turn > tick + PAUSED_S:
                # this process was not running (stopped, starved): the silence is ours
                gap = now - t_turn - tick
                t_heard, t_ready, self.paused = t_heard + gap, t_ready + gap, (now, gap)
                log.warning("controller: not running for %.1f s (stopped or starved); "
                            "nobody's silence in that time is counted", gap)
            t_turn = now
            if self.drill.error is not None:
                raise RunFailed(f"drill: {self.drill.error}")
            t_heard = max(t_heard, self._moving.get(spec.job, 0.0))
            if tally.all_ready and time.monotonic() - t_heard > stall_s:
                # light a fault swallowed unseen, or a node program stuck: cut short, it
                # goes on with what was delivered (MAX_STOPS such stops at most)
                raise stopped(f"job {spec.job}: no report and no control message for "
                              f"{stall_s:.1f} s: {tally.progress()}")
            if not stop.faults():
                mark = len(tally.recorded)
            elif len(tally.recorded) > mark or stop.overdue(self.clock.now_ns()):
                # at an iteration boundary, or the fault keeps the iteration from one
                raise stopped(stop.why())
            try:
                # (not wait_for: on Python 3.11 it swallows a cancel that lands as the
                # event does, and a cancelled job ran on: issue 44's time limit)
                async with asyncio.timeout(tick):
                    ev = await events.get()
            except TimeoutError:
                if not tally.all_ready and time.monotonic() > t_ready:
                    missing = sorted(set(spec.nodes) - tally.ready)
                    if time.monotonic() < t_ready + self.tb.monitor.grace_ms / 1e3 and \
                            all(n in self._beating and not self.health.is_dead(n)
                                for n in missing):
                        continue  # they beat: busy (a loaded host), not gone
                    raise RunFailed(
                        f"no node program answered for {', '.join(missing)} within "
                        f"{ready_s:.1f} s (is `oddl node` running beside each board, or "
                        f"`oddl emulate` serving {self.tb.name}?)") from None
                continue
            if ev is None:
                raise stopped(self._why_lost())
            if ev.kind == "failed":
                self._failed(ev, stop, stopped)
            n_recorded = len(tally.recorded)
            if tally.heard(ev):
                t_heard = time.monotonic()
            if len(tally.recorded) > n_recorded:
                self.drill.at_iteration(tally.recorded[-1] + 1)

    def _failed(self, ev: JobEvent, stop: StopRule,
                stopped: Callable[[str], JobStopped]) -> NoReturn:
        """A node's job failed: a symptom of what the watch found (the job is stopped), or
        the run's failure."""
        if found := stop.pending():
            raise stopped(f"node {ev.node}: {ev.error}; {'; '.join(map(str, found))}")
        if ev.error == LOST_BROKER and self.bus is not None and not self.bus.lost.is_set():
            raise RunFailed(
                f"node {ev.node}: {ev.error}, while the broker was up (the controller's "
                f"connection held): another login as {ev.node} took its session over "
                f"(Mosquitto does: a second node program for {ev.node}?), or {ev.node}'s "
                f"network dropped")
        raise RunFailed(f"node {ev.node}: {ev.error}")

    def _why_lost(self) -> str:
        """Why the controller's connection went: its own pause, if it had just been
        stopped for longer than the broker waits for a silent party (1.5 keepalives)."""
        at, gap = self.paused
        if gap > 1.5 * CONTROLLER_KEEPALIVE_S and time.monotonic() - at < 5.0:
            return (f"the controller was not running for {gap:.1f} s (stopped or starved), "
                    f"and the broker gave its connection up after "
                    f"{1.5 * CONTROLLER_KEEPALIVE_S:g} s of silence")
        return "the broker went away"

    def _reject(self, topic: object, why: object) -> None:
        self.rejected += 1
        if worth_logging(self.rejected):
            log.warning("controller: %s: message rejected: %s (%d so far)", topic, why,
                        self.rejected)

    def _outcome(self, spec: JobSpec, done: Mapping[str, JobEvent], rejected: int
                 ) -> JobOutcome:
        stats: dict[str, Any] = {}
        violations: list[str] = []
        for ev in done.values():
            for k, v in ev.stats.items():
                stats[k] = stats.get(k, 0) + v
            violations += [v for v in ev.violations if v not in violations]
        flows = stats.pop("flows", 0)
        stats.pop("violations", None)
        stats["rejected"] = stats.get("rejected", 0) + rejected
        stats |= {"step_sync": step_sync(spec), "stage2": "oddl node beside each O-NIC"}
        self.monitor.violations += violations
        self.monitor.jobs += [spec.job] * len(violations)  # (`of_job` reads them in step)
        return JobOutcome(sum(ev.control_messages for ev in done.values()), flows, stats,
                          violations)

    def pause(self, job: str, ns: int) -> bool:
        return False  # ODDL: a job's partition is its own, no link to share

    def fan_out(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Stage 1's calls, one per device, at once: each board (PYNQ.remote) and WSS
        (its serial line) has its own connection, and the loop waits for them all
        anyway (a 2-node job's admit on the emulated 2 x 2 grid: 0.51 s one by one,
        0.29 s at once). Every call ends before the first failure is raised: nothing is
        left half-written behind it."""
        if len(calls) < 2:
            return [c() for c in calls]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(DEVICE_THREADS,
                                            thread_name_prefix=cassette.STAGE1_THREADS[1])
        futures = [self._pool.submit(c) for c in calls]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]

    def off_loop(self, work: Callable[[], T], then: Callable[[T | BaseException], None]
                 ) -> None:
        """One worker thread: one partition's stage 1 at a time, in the order asked (the
        arbiter's state of live jobs is the worker's while it runs). Its end is handed to
        the loop; a loop closed meanwhile (the run is over) is told nothing."""
        if self._stage1 is None:
            self._stage1 = ThreadPoolExecutor(1, thread_name_prefix=cassette.STAGE1_THREADS[0])

        def done(f: concurrent.futures.Future[T]) -> None:
            got = f.exception() or f.result()
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.call_soon_threadsafe(then, got)

        self._stage1.submit(work).add_done_callback(done)

    def close(self) -> None:
        if not self.loop.is_closed():
            try:
                self.loop.run_until_complete(self._disconnect())
            finally:
                close_loop(self.loop)
        if self._stage1 is not None:  # a set-up under way ends before its devices close
            self._stage1.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for w in self.wss.values():
            w.close()

    async def _disconnect(self) -> None:
        # a stop (Ctrl-C, SIGTERM) left jobs out: each is cancelled while the connection
        # still listens, so that its nodes' word that they dropped it is heard (a second
        # or so), and only then is the connection closed
        if following := [t for t in self._following if not t.done()]:
            for t in following:
                t.cancel()
            await asyncio.gather(*following, return_exceptions=True)
        await self.drill.finish()
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self.bus is not None:
            while self._notes and not self.bus.lost.is_set():  # the run's last words
                topic, payload, retain = self._notes.popleft()
                with contextlib.suppress(BusError):
                    await self.bus.publish(topic, payload, qos=int(retain), retain=retain)
            await self.bus.close()
