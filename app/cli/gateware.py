"""`oddl gateware verilog | synth | recipe`: the O-NIC's gateware (fpga/gateware)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from oddl.app.cli.main import emit, fail, main
from oddl.controller.base.extras import require


@main.group()
def gateware() -> None:
    """The O-NIC's control IP (onic_ctrl) in Amaranth HDL: Verilog, synthesis, bitstream
    (the `gateware` extra: pip install "oddl[gateware]")."""
    require("gateware", "oddl gateware")


@gateware.command()
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="directory for onic_ctrl.v")
def verilog(out: Path) -> None:
    """Write the IP as Verilog (what Vivado and Yosys read)."""
    from oddl.fpga.gateware.build import write_verilog

    out = out.absolute()
    if out.is_symlink() and not out.exists():
        fail(f"--out {out}: a symbolic link to {os.readlink(out)}, which does not exist")
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: not a directory (onic_ctrl.v is written into one)")
    try:
        click.echo(str(write_verilog(out)))
    except OSError as e:
        fail(f"--out {out}: onic_ctrl.v cannot be written there ({e.strerror or e})")


@gateware.command()
@click.option("--verilog", "source", type=click.Path(path_type=Path, exists=True),
              default=None, help="synthesise this Verilog of onic_ctrl alone (default: "
                                 "generate onic_ctrl and the control unit)")
@click.option("--json", "as_json", is_flag=True, help="stdout: exactly one JSON object")
def synth(source: Path | None, as_json: bool) -> None:
    """Yosys synth_xilinx for Zynq UltraScale+: LUTs, flip-flops, BRAMs, DSPs of onic_ctrl
    and, apart, of the stage-2 control unit (ctrl_unit, at a board's bounds): about 4 min."""
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
        out = {k: res[k] for k in keys} | {"clock": timing}
        if cu is not None:
            out["control_unit"] = {k: cu[k] for k in keys} | {"bounds": BUILD}
        emit(out)
        return
    click.echo(f"onic_ctrl for Zynq UltraScale+ (Yosys synth_xilinx): {res['luts']} LUTs, "
               f"{res['ffs']} flip-flops, {res['brams']:g} BRAM36, {res['lutram']} LUTRAM "
               f"cells, {res['dsps']} DSPs")
    if cu is not None:
        click.echo(f"ctrl_unit (the stage-2 control unit; {BUILD['nodes']} routes, "
                   f"{BUILD['txq']} flows, {BUILD['rxq']} waiting REQUESTs and "
                   f"{BUILD['done']} delivered keys a port): {cu['luts']} LUTs, {cu['ffs']} "
                   f"flip-flops, {cu['brams']:g} BRAM36, {cu['lutram']} LUTRAM cells, "
                   f"{cu['dsps']} DSPs")
    click.echo(timing)


@gateware.command()
def recipe() -> None:
    """Where the Vivado recipe is, and how a lab runs it for the real bitstream."""
    from oddl.fpga.gateware.build import VIVADO_DIR, recipe

    r = recipe()
    boards = " | ".join(sorted(p.stem for p in (VIVADO_DIR / "boards").glob("*.tcl")))
    click.echo(f"{VIVADO_DIR} (Vivado {r['vivado']}, IP {r['vlnv']})\n\n"
               f"  make -f {VIVADO_DIR / 'Makefile'} BOARD={{{boards}}} [OUT=DIR]\n\n"
               "writes DIR/oddl_onic.bit, .hwh and .design.sha256 (docs/gateware.md)")
