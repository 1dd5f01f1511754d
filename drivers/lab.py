"""The emu and hw back ends: a testbed's devices through the drivers a lab runs.

The controller opens every board (PYNQ.remote `grpc://HOST:PORT`, or `local`) to apply
stage 1 and read it back, each WSS over its serial port, and hands jobs to the node
programs beside the boards over MQTT (`oddl node`; `oddl emulate` runs them for its
emulated boards). It never touches a per-flow register: the nodes report iterations, and
the controller records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiomqtt
import msgspec
from oddl.controller.access import CONTROLLER, results, run_topic, status_topic
from oddl.controller.backend import Iteration, JobOutcome, OnIteration, RunFailed
from oddl.controller.config import Testbed
from oddl.controller.invariants import InvariantChecker
from oddl.controller.job import DECODE_ERRORS, JobEvent, JobSpec, step_sync
from oddl.controller.topology import Grid
from oddl.controller.wire import worth_logging
from oddl.drivers.mqtt import client_from_config
from oddl.drivers.onic import DriverONic, ONicDriver, open_onic
from oddl.drivers.wss import WSSDriver
from oddl.fpga import regmap as R
from oddl.fpga.overlay import BITFILE

log = logging.getLogger(__name__)
READY_MIN_S = 3.0
CONTROLLER_KEEPALIVE_S = 10  # a hung controller is given up 15 s on


def ready_within_s(spec: JobSpec) -> float:
    """How long node programs may take to say "ready": a flow's whole retry budget, which
    is what a silent peer would cost anyway (at least a few seconds)."""
    t = spec.timing
    return max(READY_MIN_S, t.request_timeout_ns * (t.max_retries + 1) / 1e9)


class Unreachable(RuntimeError):
    """A board the config names that cannot be reached (the message says why)."""


def open_board(addr: str | None, node: str, nodes: list[str], bitfile: Path = BITFILE
               ) -> ONicDriver:
    """An ONicDriver on a board address: grpc://HOST:PORT (PYNQ.remote) or `local` (this
    host's PL). Its overlay's .hwh is held to the register map and the board's identity
    block to the design version (`open_onic`); the bitstream is the board's own."""
    if addr and addr.startswith("grpc://"):
        from pynq.pl_server.remote_device import RemoteDevice

        host, _, port = addr.removeprefix("grpc://").rpartition(":")
        device = RemoteDevice(0, host, port=int(port))
    elif addr == "local":
        from pynq import Device

        device = Device.active_device
    else:
        raise Unreachable(f"board address {addr!r} is neither grpc://HOST:PORT nor 'local'")
    return open_onic(bitfile, device, node, nodes, download=False)


def ports_of(grid: Grid, node: str) -> tuple[str, ...]:
    return tuple(p for p in R.PORTS if grid.group_of(node, p).wss)


class LabBackend:
    """Real devices (hw) or `oddl emulate`'s (emu): the same code, other addresses."""

    def __init__(self, tb: Testbed, grid: Grid, name: str = "hw",
                 checker_mode: str = "record") -> None:
        self.name = name
        self.tb = tb
        self.loop = asyncio.new_event_loop()
        # the controller's view: what the nodes report (the light is the devices' business,
        # and where a fabric model exists, the emulator's own monitor judges it)
        self.monitor = InvariantChecker(mode=checker_mode)
        self.rejected = 0  # result-topic messages that were no result of the job's
        self.health = None  # heartbeats over MQTT: not yet watched by this back end
        self.injected: list[Any] = []
        nodes = list(grid.nodes)
        addr = {n.id: n.board for n in tb.nodes}
        self.onics: dict[str, DriverONic] = {}
        self.wss: dict[str, WSSDriver] = {}
        try:
            for n in nodes:
                drv = self.loop.run_until_complete(
                    asyncio.to_thread(open_board, addr[n], n, nodes))
                self.onics[n] = DriverONic(drv, ports_of(grid, n))
            for w in tb.wss:
                if not w.serial:
                    raise RunFailed(f"WSS {w.id}: no serial port in the testbed config")
                self.wss[w.id] = WSSDriver(w.serial)
        except BaseException:
            self.close()
            raise

    async def run_job(self, spec: JobSpec, on_iteration: OnIteration,
                      record_flows: bool) -> JobOutcome:
        """Publish the job; record each iteration once every rank has reported it."""
        limit = spec.iterations * (spec.compute_ns / 1e9 + 5.0) + 30.0
        try:
            return await asyncio.wait_for(self._run(spec, on_iteration), limit)
        except TimeoutError:
            raise RunFailed(f"job {spec.job}: not done within {limit:.0f} s") from None

    async def _run(self, spec: JobSpec, on_iteration: OnIteration) -> JobOutcome:
        tb = self.tb.name
        dec = msgspec.json.Decoder(JobEvent)
        ready: set[str] = set()
        reports: dict[int, dict[str, JobEvent]] = {}
        recorded: set[int] = set()
        sent: dict[str, int] = {}
        done: dict[str, JobEvent] = {}
        last_msgs = 0
        status = status_topic(tb, CONTROLLER)
        # the nodes cancel the job when this goes: a clean exit, a crash, or (keepalive)
        # a controller that hangs
        client = client_from_config(self.tb.broker, CONTROLLER, testbed=tb,
                                    keepalive=CONTROLLER_KEEPALIVE_S)
        async with client:
            await client.publish(status, b"online", qos=1, retain=True)
            await client.subscribe(results(tb), qos=1)
            await client.publish(run_topic(tb), msgspec.json.encode(spec), qos=1)
            ready_s = ready_within_s(spec)
            t_ready = time.monotonic() + ready_s
            messages = aiter(client.messages)
            try:
                while len(done) < len(spec.nodes):
                    wait = t_ready - time.monotonic() if len(ready) < len(spec.nodes) else None
                    try:
                        m = await asyncio.wait_for(anext(messages), wait)
                    except TimeoutError:
                        missing = sorted(set(spec.nodes) - ready)
                        raise RunFailed(
                            f"no node program answered for {', '.join(missing)} within "
                            f"{ready_s:.1f} s (is `oddl node` running beside each board, or "
                            f"`oddl emulate` serving {tb}?)") from None
                    if not m.topic.matches(results(tb)):
                        continue  # amqtt has been seen to pass a retained status here
                    ev = self._event(dec, str(m.topic), bytes(m.payload), spec)  # type: ignore[arg-type]
                    if ev is None:
                        continue
                    if ev.kind == "ready":
                        ready.add(ev.node)
                    elif ev.kind == "failed":
                        raise RunFailed(f"node {ev.node}: {ev.error}")
                    elif ev.kind == "done":
                        if len(recorded) < spec.iterations:
                            raise RunFailed(
                                f"node {ev.node} said its job was done after "
                                f"{len(recorded)} of {spec.iterations} iterations")
                        done[ev.node] = ev
                        sent[ev.node] = ev.control_messages
                    elif ev.kind == "iteration" and ev.node in spec.ranks:
                        if ev.iteration in recorded or not 0 <= ev.iteration < spec.iterations:
                            self._reject(m.topic, f"iteration {ev.iteration} from {ev.node}: "
                                                  f"already recorded or out of range")
                            continue
                        sent[ev.node] = ev.control_messages
                        got = reports.setdefault(ev.iteration, {})
                        got[ev.node] = ev
                        if len(got) == len(spec.ranks):
                            del reports[ev.iteration]
                            recorded.add(ev.iteration)
                            slow = max(got.values(), key=lambda e: e.t_end - e.t_start)
                            msgs = sum(sent.values())
                            on_iteration(Iteration(ev.iteration, slow.t_start, slow.t_end,
                                                   msgs - last_msgs))
                            last_msgs = msgs
            finally:  # the nodes cancel the job at once (the will covers a lost broker)
                with contextlib.suppress(aiomqtt.MqttError):
                    await client.publish(status, b"offline", qos=1, retain=True)
        return self._outcome(spec, done)

    def _event(self, dec: msgspec.json.Decoder[JobEvent], topic: str, payload: bytes,
               spec: JobSpec) -> JobEvent | None:
        """A result of this job's, from the node its topic names; anything else is counted,
        logged and dropped."""
        try:
            ev = dec.decode(payload)
        except DECODE_ERRORS as e:
            self._reject(topic, e)
            return None
        if ev.node != topic.rpartition("/")[2] or ev.node not in spec.nodes:
            self._reject(topic, f"an event of {ev.node!r}, not of a node of this job on "
                                f"its own topic")
            return None
        return ev if ev.job == spec.job else None

    def _reject(self, topic: object, why: object) -> None:
        self.rejected += 1
        if worth_logging(self.rejected):
            log.warning("controller: %s: result rejected: %s (%d so far)", topic, why,
                        self.rejected)

    def _outcome(self, spec: JobSpec, done: Mapping[str, JobEvent]) -> JobOutcome:
        stats: dict[str, Any] = {}
        violations: list[str] = []
        for ev in done.values():
            for k, v in ev.stats.items():
                stats[k] = stats.get(k, 0) + v
            violations += [v for v in ev.violations if v not in violations]
        flows = stats.pop("flows", 0)
        stats.pop("violations", None)
        stats["rejected"] = stats.get("rejected", 0) + self.rejected
        stats |= {"step_sync": step_sync(spec), "stage2": "oddl node beside each O-NIC"}
        self.monitor.violations += violations
        return JobOutcome(sum(ev.control_messages for ev in done.values()), flows, stats,
                          violations)

    def close(self) -> None:
        for w in self.wss.values():
            w.close()
        if not self.loop.is_closed():
            self.loop.close()
