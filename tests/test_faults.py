"""Emulator faults: each shows up exactly where the real device would show it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.controller.base.config import load_testbed
from oddl.fpga import regmap as R
from oddl.sim.devices.faults import FaultSpecError, install, parse_fault

from tests.helpers import Bench, emulator


def _tb(root: Path):  # type: ignore[no-untyped-def]
    return load_testbed(root / "hw_configs" / "prototype-4node.toml")


@pytest.mark.parametrize("spec,msg", [
    ("melt:n0", "unknown kind 'melt'"),
    ("slow-tx:n0:25", "no port .. on n0: H or V"),
    ("slow-tx:n0/H", "expected slow-tx:NODE/PORT:NS"),
    ("slow-tx:n9/H:25", "no node 'n9'"),
    ("wss-route:wss-x:0/0:1", "no WSS 'wss-x'"),
    ("wss-route:wss-row0:0/5:1", "outside wss-row0"),
])
def test_bad_fault_specs(root: Path, spec: str, msg: str) -> None:
    with pytest.raises(FaultSpecError, match=msg):
        parse_fault(spec, _tb(root))


def test_cli_rejects_a_bad_fault(root: Path) -> None:
    r = CliRunner().invoke(main, ["emulate", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--fault", "slow-tx:n0"])
    assert r.exit_code == 2 and "expected slow-tx:NODE/PORT:NS" in r.output


def test_slow_transmitter_is_seen_in_its_tune_time() -> None:
    b = Bench()
    install(b.st, b.clock, [parse_fault("slow-tx:n0-1/H:25", _bench_tb(b))])
    b.drv[1].tune("H", 1)
    b.drv[0].tune("H", 1)
    b.run_ns(30)
    assert b.drv[1].last_tune_ns("H") == 25
    assert b.drv[0].last_tune_ns("H") == 11  # the others are healthy


def _bench_tb(b: Bench):  # type: ignore[no-untyped-def]
    from tests.helpers import make_testbed

    return make_testbed(1, 4, wavelengths=3)


def test_misrouting_wss_reads_back_right_but_light_lands_elsewhere() -> None:
    b = Bench()
    install(b.st, b.clock, [parse_fault("wss-route:wss-row0:0/0:2", _bench_tb(b))])
    assert b.st.wss["wss-row0"].get_table()[0] == [1, 2, 3]  # the table looks right
    b.drv[0].tune("H", 0)  # channel 0 should reach n0-1
    b.run_ns(11)
    b.grant(0, 1, 1, 0, 4000)
    b.drv[0].start_transfer("H", 1, 4000, 1)
    b.run_ns(1000)
    assert b.drv[1].counters("H")["rx_done"] == 0
    assert b.drv[2].counters("H")["rx_done"] == 1
    assert any("lands on n0-2 but n0-1 granted it" in v for v in b.st.checker.violations)


def test_corrupting_link_counts_crc_errors() -> None:
    b = Bench()
    install(b.st, b.clock, [parse_fault("corrupt-link:n0-1/H", _bench_tb(b))])
    b.drv[0].tune("H", 0)
    b.run_ns(11)
    for k in range(2):
        b.grant(0, 1, k, 0, 100)
        b.drv[0].start_transfer("H", 1, 100, k)
        b.run_ns(500)
    assert b.drv[1].counters("H")["rx_errors"] == 2
    b.mmio[1].write(R.BY_NAME["RXH_ERRORS"].offset, 0xFFFFFFFF)  # W1C
    assert b.drv[1].counters("H")["rx_errors"] == 0
    assert b.drv[2].counters("H")["rx_errors"] == 0


@pytest.mark.realtime
def test_dead_board_does_not_answer(root: Path, tmp_path: Path) -> None:
    from pynq.pl_server.remote_device import RemoteDevice

    out = tmp_path / "emu.toml"
    with emulator(root, root / "hw_configs" / "prototype-4node.toml", out,
                  "--fault", "dead-board:n2") as (proc, lines):
        assert "fault: dead-board n2 at 0 ms" in lines
        tb = load_testbed(out)
        ports = {n.id: int(n.board.rsplit(":", 1)[1]) for n in tb.nodes}  # type: ignore[union-attr]
        RemoteDevice(0, "127.0.0.1", port=ports["n1"])  # a healthy one answers
        with pytest.raises(RuntimeError, match="Failed to connect"):
            RemoteDevice(0, "127.0.0.1", port=ports["n2"])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130  # a clean stop by SIGINT
