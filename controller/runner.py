"""The experiment runner: one workload, several networks, the same engine for each.

For each network it builds a back end, runs stage 1 (inventory, plan, apply, read back)
where the network has one, then runs the iterations and records every one as it
completes. The back end is chosen here and only here.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from oddl.controller.arbiter import Arbiter
from oddl.controller.clock import Clock
from oddl.controller.collectives import Schedule, build
from oddl.controller.config import LoadedExperiment, NetworkSpec
from oddl.controller.control_unit import ControlUnit, Timing
from oddl.controller.messages import Flow
from oddl.controller.plan import Plan
from oddl.controller.results import FlowRow, RunStore
from oddl.controller.topology import Grid
from oddl.controller.workloads import CollectiveEngine, model_spec, total_iterations
from oddl.fpga.countaction import step_sync
from oddl.fpga.regmap import N_MODULES


class RunFailed(RuntimeError):
    pass


@dataclass
class NetworkResult:
    name: str
    kind: str
    training_time_s: float
    iteration_time_s: float
    iterations: int
    flows: int
    control_messages: int
    invariant_violations: int
    stats: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("name", "kind", "stats")}


@dataclass
class RunResult:
    experiment: str
    backend: str
    networks: dict[str, NetworkResult]
    ratio: float | None
    invariant_violations: int
    wall_s: float
    compute_ns: int
    calibration: str
    iterations: int
    total_iterations: int
    run_dir: str | None = None
    violations: list[str] = field(default_factory=list)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "backend": self.backend,
            "networks": {n: r.public() for n, r in self.networks.items()},
            "ratio": self.ratio,
            "invariant_violations": self.invariant_violations,
            "wall_s": round(self.wall_s, 3),
        }


Progress = Callable[[str, int, int], None]  # network, done, total


class _NetworkRun:
    """One network's run on its own virtual clock."""

    def __init__(self, ctx: LoadedExperiment, spec: NetworkSpec, grid: Grid,
                 schedule: Schedule, backend: str, checker_mode: str) -> None:
        import asyncio

        from oddl.sim.clock import VirtualClockLoop  # the sim back end's clock

        # emu/hw: the ODDL network runs on the devices the testbed config names, in real
        # time; a baseline network is a model in every back end (there is no hardware)
        self.real = backend in ("emu", "hw") and spec.kind == "oddl"
        # emu: stage 2 runs beside the emulated boards (controller/nodejob.py); hw: this
        # controller drives the boards' registers over the network itself
        self.node_side = self.real and backend == "emu"
        self.devices: Any = None
        self.ctx = ctx
        self.spec = spec
        self.loop = asyncio.new_event_loop() if self.real else VirtualClockLoop()
        self.clock = Clock(self.loop)
        self.error: BaseException | None = None
        self.done = self.loop.create_future()
        self.loop.set_exception_handler(self._loop_error)
        tb, exp = ctx.testbed, ctx.experiment
        ranks = grid.nodes[: len(schedule)]
        self.plan: Plan | None = None
        self.nic_sync = False
        self.stats: Callable[[], dict[str, Any]]
        if spec.kind == "oddl":
            if self.real:
                from oddl.drivers.testbed import open_devices
                from oddl.sim.invariants import InvariantChecker

                # the controller's view: the bus and every delivery (the light is the
                # devices' business, and the emulator's own checker watches it)
                self.checker = InvariantChecker(mode=checker_mode)
                st = self.devices = self.loop.run_until_complete(
                    open_devices(tb, grid, tap=self.checker.on_message))
            else:
                from oddl.sim import backend as sim_backend

                st = sim_backend.build(tb, grid, self.clock, exp.faults, exp.seed,
                                       checker_mode)
                self.checker = st.checker
            arb = Arbiter(tb, grid, st.onics, st.wss)  # type: ignore[arg-type]
            arb.inventory()
            gc.collect()  # time the planner, not a collection of an earlier run's garbage
            t_plan = time.perf_counter()
            self.plan = arb.plan(schedule, spec.strategy)
            self.plan_s = time.perf_counter() - t_plan
            # step synchronisation runs on the O-NICs' count-action engines when the
            # schedule fits them; otherwise the host counts deliveries
            self.nic_sync = all(0 < len(s) <= N_MODULES and all(st_.recv_bytes > 0 for st_ in s)
                                for s in schedule)
            programs = ({n: step_sync([st_.recv_bytes for st_ in schedule[r]])
                         for r, n in enumerate(ranks)} if self.nic_sync else None)
            arb.apply(self.plan, programs)
            o, c = tb.optical, tb.control
            timing = Timing(math.ceil(o.tuning_time_ns), math.ceil(o.guard_time_ns),
                            math.ceil(o.propagation_ns), math.ceil(c.request_timeout_ns),
                            math.ceil(c.request_timeout_ns), math.ceil(c.grant_lease_ns),
                            c.max_retries)
            if self.node_side:
                self._prepare_node_job(ctx, spec, grid, schedule, ranks, timing)
                return
            self.engine = CollectiveEngine(self.clock, schedule, ranks, self._submit_oddl,
                                           self.checker.flow_started, self.nic_sync)
            if self.nic_sync:
                for n in ranks:
                    st.onics[n].on_module_fired = (
                        lambda slot, n=n: self.engine.module_fired(n, slot))
            delivered = self._delivered_real if self.real else self.engine.on_delivered
            self.cus = {n: ControlUnit(n, self.clock, st.bus, st.onics[n],
                                       self.plan.routes.get(n, {}), timing, delivered,
                                       self._fail)
                        for n in grid.nodes}
            bus, fabric = st.bus, getattr(st, "fabric", None)
            if self.real:
                from oddl.drivers.testbed import start_pollers

                self.loop.run_until_complete(bus.start())  # subscribes the attached units
                start_pollers(self.devices, self.loop)

            def oddl_stats() -> dict[str, Any]:
                agg: dict[str, int] = {}
                for cu in self.cus.values():
                    for k, v in cu.stats.items():
                        agg[k] = agg.get(k, 0) + v
                out = {**agg, "plan_s": round(self.plan_s, 4), "step_sync": self.step_sync}
                if fabric is None:  # real devices: what the controller's side can count
                    return {**out, "messages_received": bus.received,
                            "messages_rejected": bus.rejected}
                fires = sum(m.fire_count for b in st.boards.values() for m in b.ca)
                return {**out, "count_action_fires": fires,
                        "messages_dropped": bus.dropped, "messages_delayed": bus.delayed,
                        "transfers": fabric.transfers,
                        "tunes": sum(t.tunes for t in fabric.tx.values())}

            self.stats = oddl_stats
            self.control_messages = lambda: bus.sent
        else:
            from oddl.sim.invariants import InvariantChecker

            self.checker = InvariantChecker(mode=checker_mode)
            self.engine = CollectiveEngine(self.clock, schedule, ranks, self._submit_el,
                                           self.checker.flow_started)
            from oddl.sim.baselines import build_network

            self.switch = build_network(spec, self.clock, ranks, tb.optical.line_rate_gbps,
                                        self._deliver_el)
            self.stats = lambda: {"transfers": self.switch.flows}
            self.control_messages = lambda: 0

    @property
    def step_sync(self) -> str:
        return "o-nic count-action" if self.nic_sync else "host"

    @staticmethod
    def _real_time_limit(n_iter: int, compute_ns: int) -> float:
        """Seconds a real-time run may take before it is declared stuck."""
        return n_iter * (compute_ns / 1e9 + 5.0) + 30.0

    def _prepare_node_job(self, ctx: LoadedExperiment, spec: NetworkSpec, grid: Grid,
                          schedule: Schedule, ranks: list[str], timing: Timing) -> None:
        import dataclasses
        import os

        from oddl.controller.nodejob import JOB_VERSION, JobSpec

        w, tb = ctx.experiment.workload, ctx.testbed
        assert self.plan is not None
        self.job = JobSpec(
            JOB_VERSION, f"{ctx.experiment.name}-{spec.name}-{os.getpid()}-{time.time_ns()}",
            spec.collective or w.collective, model_spec(w.model).grad_bytes(w.bytes_per_param),
            tb.grid.rows, tb.grid.cols, spec.degree, list(ranks), list(grid.nodes), 0, 0,
            self.nic_sync, list(dataclasses.astuple(timing)),
            {n: {d: (r.port, r.channel, r.next_hop) for d, r in routes.items()}
             for n, routes in self.plan.routes.items()})
        self.flows_per_iteration = sum(len(st.sends) for steps in schedule for st in steps)
        self.flow_total = 0
        self.msgs = 0
        self.node_stats: dict[str, Any] = {}
        self.stats = lambda: {"plan_s": round(self.plan_s, 4), "step_sync": self.step_sync,
                              "stage2": "node side (beside the boards)", **self.node_stats}
        self.control_messages = lambda: self.msgs

    def _run_node_job(self, n_iter: int, compute_ns: int, store: RunStore | None,
                      progress: Progress | None) -> list[tuple[int, int]]:
        """Publish the job; record every iteration the node side reports, as it arrives."""
        import asyncio

        import msgspec
        from oddl.controller.nodejob import JobEvent, result_topic, run_topic
        from oddl.drivers.mqtt import client_from_config

        tb = self.ctx.testbed
        job = msgspec.structs.replace(self.job, iterations=n_iter, compute_ns=compute_ns)
        times: list[tuple[int, int]] = []
        dec = msgspec.json.Decoder(JobEvent)
        name = self.spec.name

        async def drive() -> None:
            client = client_from_config(tb.broker, f"oddl-ctl-{job.job}"[:64])
            async with client:
                await client.subscribe(result_topic(tb.name), qos=1)
                await client.publish(run_topic(tb.name), msgspec.json.encode(job), qos=1)
                last = 0
                async for m in client.messages:
                    try:
                        ev = dec.decode(bytes(m.payload))  # type: ignore[arg-type]
                    except msgspec.DecodeError:
                        continue
                    if ev.job != job.job:
                        continue
                    if ev.kind == "failed":
                        raise RunFailed(f"{name}: the node side failed: {ev.error}")
                    if ev.kind == "done":
                        self.msgs, self.node_stats = ev.control_messages, dict(ev.stats)
                        # the testbed's own checker (the emulated fabric's) is the judge here
                        self.checker.violations += ev.violations
                        bad = self.node_stats.get("fabric_violations", 0)
                        if bad > len(ev.violations):
                            self.checker.violations.append(
                                f"... and {bad - len(ev.violations)} more on the testbed")
                        return
                    times.append((ev.t_start, ev.t_end))
                    self.flow_total += self.flows_per_iteration
                    if store is not None:
                        store.add_iteration(name, ev.iteration, ev.t_start, ev.t_end,
                                            compute_ns, ev.control_messages - last, [])
                    last = ev.control_messages
                    if progress is not None:
                        progress(name, ev.iteration + 1, n_iter)

        limit = self._real_time_limit(n_iter, compute_ns)
        try:
            self.loop.run_until_complete(asyncio.wait_for(drive(), limit))
        except TimeoutError:
            raise RunFailed(f"{name}: no answer from the node side within {limit:.0f} s "
                            f"(is `oddl emulate` serving {tb.name}?)") from None
        finally:
            self.devices.close()
            self.loop.close()
        return times

    def _delivered_real(self, f: Flow) -> None:
        self.checker.on_arrival(self.clock.now_ns(), f.dst, f, f.nbytes)
        self.engine.on_delivered(f)

    def _submit_oddl(self, f: Flow) -> None:
        self.cus[f.src].submit(f)

    def _submit_el(self, f: Flow) -> None:
        self.switch.submit(f)

    def _deliver_el(self, f: Flow) -> None:
        self.checker.on_arrival(self.clock.now_ns(), f.dst, f, f.nbytes)
        self.engine.on_delivered(f)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if not self.done.done():
            self.done.set_exception(exc)

    def _loop_error(self, loop: Any, context: dict[str, Any]) -> None:
        exc = context.get("exception") or RuntimeError(context.get("message", "loop error"))
        self._fail(exc)

    def run(self, n_iter: int, compute_ns: int, store: RunStore | None,
            progress: Progress | None, record_flows: bool) -> list[tuple[int, int]]:
        if self.node_side:
            return self._run_node_job(n_iter, compute_ns, store, progress)
        times: list[tuple[int, int]] = []
        flows: list[FlowRow] = []
        name = self.spec.name
        if record_flows and store is not None:
            def hook(f: Flow, t: int) -> None:
                flows.append((f.id, f.step, f.src, f.dst, f.nbytes, f.hop + 1, f.t_submit, t))
            self.engine.on_delivered_hook = hook
        last_msgs = [0]

        def finished(i: int, t_end: int) -> None:
            t0 = self.engine.t_start
            times.append((t0, t_end))
            if store is not None:
                msgs = self.control_messages()
                store.add_iteration(name, i, t0, t_end, compute_ns, msgs - last_msgs[0], flows)
                last_msgs[0] = msgs
                flows.clear()
            if progress is not None:
                progress(name, i + 1, n_iter)
            if i + 1 < n_iter:
                self.engine.start_iteration(i + 1, compute_ns, lambda t: finished(i + 1, t))
            elif not self.done.done():
                self.done.set_result(None)

        self.engine.start_iteration(0, compute_ns, lambda t: finished(0, t))
        try:
            if self.real:  # real time: bounded, so a device that stops answering ends it
                import asyncio

                limit = self._real_time_limit(n_iter, compute_ns)
                self.loop.run_until_complete(asyncio.wait_for(self.done, limit))
            else:
                self.loop.run_until_complete(self.done)
        except RuntimeError as e:
            if "deadlock" not in str(e):
                raise
            missing = self.checker.undelivered()
            raise RunFailed(f"{name}: the run stalled with nothing left to do; "
                            f"{len(missing)} flows undelivered, e.g. ids {missing[:5]}") from e
        finally:
            if self.real:
                self.devices.close()
                self.loop.run_until_complete(self.devices.bus.close())
            self.loop.close()
        self.checker.finish(self.clock.now_ns())
        return times


def run_experiment(ctx: LoadedExperiment, backend: str = "sim", store: RunStore | None = None,
                   iterations: int | None = None, progress: Progress | None = None,
                   checker_mode: str = "record") -> RunResult:
    t_wall = time.perf_counter()
    exp, tb = ctx.experiment, ctx.testbed
    w = exp.workload
    grid = Grid.from_testbed(tb)
    n = tb.n_nodes
    size = model_spec(w.model).grad_bytes(w.bytes_per_param)
    full = total_iterations(w, n)
    n_iter = iterations or exp.iterations or full
    by_name = {s.name: s for s in exp.networks}
    built: dict[tuple[str, int], Schedule] = {}
    schedules: dict[str, Schedule] = {}
    for s in exp.networks:  # each network's collective (the workload's unless it names one)
        coll = s.collective or w.collective
        key = (coll, s.degree if coll == "totientrings" else 0)  # only TopoOpt's uses d
        if key not in built:
            built[key] = build(coll, n, size, tb.grid.rows, tb.grid.cols, s.degree)
        schedules[s.name] = built[key]

    if w.calibrate is not None:
        cal = w.calibrate
        probe = _NetworkRun(ctx, by_name[cal.network], grid, schedules[cal.network], backend,
                            "raise")
        t = probe.run(3, 0, None, None, False)
        comm_ns = sum(b - a for a, b in t) / len(t)
        per_iter = cal.training_time_min * 60e9 / full
        compute_ns = round(per_iter - comm_ns)
        if compute_ns < 0:
            raise RunFailed(f"calibration impossible: {cal.network} needs {comm_ns / 1e6:.3f} ms "
                            f"per iteration for communication alone, more than the "
                            f"{per_iter / 1e6:.3f} ms the target allows")
        calibration = (f"compute {compute_ns / 1e6:.4f} ms/iteration = {cal.training_time_min} min "
                       f"/ {full} iterations - {comm_ns / 1e6:.4f} ms {cal.network} "
                       f"communication (measured)")
    else:
        compute_ns = round((w.compute_time_ms or 0.0) * 1e6)
        calibration = f"compute {w.compute_time_ms} ms/iteration (given)"

    results: dict[str, NetworkResult] = {}
    violations: list[str] = []
    for spec in exp.networks:
        run = _NetworkRun(ctx, spec, grid, schedules[spec.name], backend, checker_mode)
        if store is not None:
            meta: dict[str, Any] = {"spec": spec.model_dump(), "compute_ns": compute_ns}
            if run.plan is not None:
                meta["plan_summary"] = run.plan.summary_lines(max_wss=2, max_nodes=4)
            store.begin_network(spec.name, spec.kind, meta)
        times = run.run(n_iter, compute_ns, store, progress, exp.flow_records == "all")
        its = [b - a for a, b in times]
        # iterations are identical in length when nothing perturbs them; extrapolate only
        # when the caller asked for fewer iterations than the workload has
        scale = full / len(its)
        results[spec.name] = NetworkResult(
            spec.name, spec.kind, sum(its) * scale / 1e9, sum(its) / len(its) / 1e9, len(its),
            run.flow_total if run.node_side else run.engine.next_flow_id,
            run.control_messages(), len(run.checker.violations),
            run.stats())
        violations += [f"{spec.name}: {v}" for v in run.checker.violations]

    oddl = next((r for r in results.values() if r.kind == "oddl"), None)
    el = next((r for r in results.values() if r.kind == "electrical"), None)
    ratio = oddl.training_time_s / el.training_time_s if oddl and el else None
    return RunResult(exp.name, backend, results, ratio, len(violations),
                     time.perf_counter() - t_wall, compute_ns, calibration, n_iter, full,
                     violations=violations)
