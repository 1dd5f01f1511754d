"""Stage 2 beside the boards: a training job run by the nodes' own control units.

On a testbed the per-flow work (REQUEST/GRANT/RELEASE, tuning, starting a transfer,
counting a step's bytes) happens at each O-NIC: its control unit reaches its registers
locally and takes its interrupts directly; only control messages cross the network. The
controller applies stage 1 (WSS tables, routes, count-action programs, read back), then
publishes a job; the node side runs it and streams back every iteration as it completes.

    oddl/<testbed>/job/run      JobSpec    (QoS 1)
    oddl/<testbed>/job/result   JobEvent   (QoS 1; one per iteration, then "done"/"failed")

`oddl emulate` hosts the node side of every emulated board (`NodeJobHost`); on hardware
the same class runs on the O-NIC hosts. JSON via msgspec, versioned, never pickle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from oddl.controller.clock import Clock
from oddl.controller.collectives import build
from oddl.controller.control_unit import ControlUnit, Timing
from oddl.controller.plan import Route
from oddl.controller.workloads import CollectiveEngine

log = logging.getLogger(__name__)
JOB_VERSION = 1


class JobSpec(msgspec.Struct):
    v: int
    job: str
    collective: str
    size: int
    rows: int
    cols: int
    degree: int
    ranks: list[str]
    nodes: list[str]
    iterations: int
    compute_ns: int
    nic_sync: bool
    timing: list[int]  # controller.control_unit.Timing, in field order
    routes: dict[str, dict[str, tuple[str, int, str]]]  # node -> dst -> (port, ch, next hop)


class JobEvent(msgspec.Struct, omit_defaults=True):
    v: int
    job: str
    kind: str  # "iteration" | "done" | "failed"
    iteration: int = -1
    t_start: int = 0
    t_end: int = 0
    control_messages: int = 0
    error: str = ""
    stats: dict[str, int] = {}
    violations: list[str] = []  # the first few the testbed's checker recorded


def run_topic(testbed: str) -> str:
    return f"oddl/{testbed}/job/run"


def result_topic(testbed: str) -> str:
    return f"oddl/{testbed}/job/result"


class NodeJobHost:
    """The node side of a testbed's boards: waits for jobs, runs them on the local O-NICs."""

    def __init__(self, testbed: str, onics: dict[str, Any], boards: dict[str, Any],
                 client_factory: Any, bus_factory: Any, checker: Any = None) -> None:
        self.testbed = testbed
        self.onics = onics  # node -> DriverONic over the board's local MMIO
        self.boards = boards  # node -> the board model (its interrupt line)
        self.client_factory = client_factory  # () -> aiomqtt.Client
        self.bus_factory = bus_factory  # (client_id) -> MQTTBus
        self._task: asyncio.Task[None] | None = None
        self.checker = checker  # the testbed's invariant checker, where it has one (emulated)

    async def start(self) -> NodeJobHost:
        self._ready = asyncio.Event()
        self._task = asyncio.create_task(self._serve())
        await asyncio.wait_for(self._ready.wait(), 10)
        return self

    async def stop(self) -> None:
        import aiomqtt

        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await self._task
            self._task = None

    async def _serve(self) -> None:
        dec = msgspec.json.Decoder(JobSpec)
        async with self.client_factory() as client:
            await client.subscribe(run_topic(self.testbed), qos=1)
            self._ready.set()
            async for m in client.messages:
                try:
                    spec = dec.decode(bytes(m.payload))  # type: ignore[arg-type]
                    if spec.v != JOB_VERSION:
                        raise ValueError(f"job version {spec.v}, this host runs {JOB_VERSION}")
                except (msgspec.DecodeError, ValueError) as e:
                    log.warning("job: rejected: %s", e)
                    continue
                await self._run(spec, client)

    async def _run(self, spec: JobSpec, client: Any) -> None:
        enc = msgspec.json.Encoder()
        loop = asyncio.get_running_loop()
        clock = Clock(loop)
        topic = result_topic(self.testbed)
        done: asyncio.Future[None] = loop.create_future()

        async def publish(ev: JobEvent) -> None:
            await client.publish(topic, enc.encode(ev), qos=1)

        def fail(exc: BaseException) -> None:
            if not done.done():
                done.set_exception(exc)

        bus = self.bus_factory(f"oddl-node-{spec.job}")
        watch = self.checker
        pending: list[asyncio.Future[None]] = []
        bad_before = len(watch.violations) if watch is not None else 0
        if watch is not None:
            watch.new_job()
        wired: list[str] = []
        try:
            missing = [n for n in spec.nodes if n not in self.onics]
            if missing:
                raise ValueError(f"this host has no O-NIC for {', '.join(map(repr, missing))}")
            schedule = build(spec.collective, len(spec.ranks), spec.size, spec.rows,
                             spec.cols, spec.degree)
            engine = CollectiveEngine(clock, schedule, spec.ranks,
                                      lambda f: cus[f.src].submit(f),
                                      watch.flow_started if watch is not None else None,
                                      spec.nic_sync)
            timing = Timing(*spec.timing)
            for n in spec.nodes:
                self.boards[n].on_irq = self.onics[n].on_interrupt  # the local line
                wired.append(n)
            if spec.nic_sync:
                for n in spec.ranks:
                    self.onics[n].on_module_fired = (
                        lambda slot, n=n: engine.module_fired(n, slot))
            cus = {n: ControlUnit(n, clock, bus, self.onics[n],
                                  {d: Route(*r) for d, r in spec.routes.get(n, {}).items()},
                                  timing, engine.on_delivered, fail)
                   for n in spec.nodes}
            await bus.start()

            def finished(i: int, t_end: int) -> None:
                ev = JobEvent(JOB_VERSION, spec.job, "iteration", i, engine.t_start, t_end,
                              bus.sent)
                pending.append(asyncio.ensure_future(publish(ev)))
                if i + 1 < spec.iterations:
                    engine.start_iteration(i + 1, spec.compute_ns,
                                           lambda t: finished(i + 1, t))
                elif not done.done():
                    done.set_result(None)

            engine.start_iteration(0, spec.compute_ns, lambda t: finished(0, t))
            await done
            await asyncio.gather(*pending)
            stats: dict[str, int] = {}
            for cu in cus.values():
                for k, v in cu.stats.items():
                    stats[k] = stats.get(k, 0) + v
            bad = list(watch.violations[bad_before:]) if watch is not None else []
            stats["fabric_violations"] = len(bad)
            await publish(JobEvent(JOB_VERSION, spec.job, "done", control_messages=bus.sent,
                                   stats=stats, violations=bad[:20]))
        except Exception as e:  # the controller hears why; the host serves the next job
            log.exception("job %s failed", spec.job)
            await publish(JobEvent(JOB_VERSION, spec.job, "failed", error=f"{e}"))
        finally:
            for n in wired:
                self.boards[n].on_irq = None
            await bus.close()
