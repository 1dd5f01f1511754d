"""A board's register map over its serial port (issue 84): `serial:PORT[?baud=B]`, pyserial,
the bridge's frames. In the suite, the driver against the frames a board's side sends on a
pseudo-terminal (a good answer, a garbled one, a cut one, another request's, none); in the
Verilator tier, against `serial_onic` itself, Verilated behind a pty: the bridge, onic_top
and its loopback, through the O-NIC driver as a lab's host drives the board."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import tty
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from oddl.controller.base.devices import DeviceRefused
from oddl.drivers.serial_board import SerialWindow, open_window, parse_address
from oddl.fpga import regmap as R
from oddl.fpga import serial_frames as S


def test_a_serial_address_is_read_or_refused_saying_why() -> None:
    assert parse_address("serial:/dev/ttyUSB1") == ("/dev/ttyUSB1", S.BAUD)
    assert parse_address("serial:/dev/ttyUSB1?baud=3000000") == ("/dev/ttyUSB1", 3_000_000)
    for bad, why in (("serial:", "no port"), ("serial:/dev/x?baud=fast", "baud 'fast'"),
                     ("serial:/dev/x?baud=99999999", "not a rate"),
                     ("serial:/dev/x?parity=E", "unknown parameter 'parity'"),
                     ("grpc://h:1", "is not serial:")):
        with pytest.raises(ValueError, match=why):
            parse_address(bad)


@contextlib.contextmanager
def board_side(answer: Callable[[bytes, int], bytes]) -> Iterator[tuple[str, list[bytes]]]:
    """A pty whose other end answers each request with `answer(request, n)` (n: how many
    came before): the serial line as a board's bridge sees it."""
    master, slave = os.openpty()
    tty.setraw(slave)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        buf = b""
        while not stop.is_set():
            try:
                buf += os.read(master, 64)
            except OSError:
                return
            while len(buf) >= S.REQ_LEN:
                req, buf = buf[: S.REQ_LEN], buf[S.REQ_LEN:]
                seen.append(req)
                if out := answer(req, len(seen) - 1):
                    os.write(master, out)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield os.ttyname(slave), seen
    finally:
        stop.set()
        os.close(slave)
        os.close(master)


def test_bad_answers_are_rejected_counted_and_the_request_sent_again() -> None:
    data = {0x10: 0x1234ABCD}

    def answer(req: bytes, n: int) -> bytes:
        seq, addr = req[2], int.from_bytes(req[3:5], "big")
        good = S.encode_answer(S.OKAY, seq, data.get(addr, 0))
        if n == 0:  # garbled on the way: a bit flipped
            return good[:4] + bytes([good[4] ^ 1]) + good[5:]
        if n == 1:  # cut short, then the line went quiet
            return good[:5]
        if n == 2:  # an answer to another request
            return S.encode_answer(S.OKAY, seq - 1, 0xBAD)
        if n == 3:  # none at all
            return b""
        return good

    with board_side(answer) as (path, seen):
        win = open_window(f"serial:{path}", "board n0")
        win.timeout_s = 0.05
        assert win.read(0x10) == 0x1234ABCD  # taken from the fifth try only
        assert win.stats == {"requests": 1, "again": 4, "rejected": 3}
        assert len({r for r in seen}) == 1  # the same request each time: its seq kept
        win.link.close()


def test_a_board_that_never_answers_well_is_a_lost_connection_naming_it() -> None:
    with board_side(lambda req, n: S.encode_answer(S.OKAY, req[2] ^ 0x80, 7)) as (path, _):
        win = open_window(f"serial:{path}", "board n3")
        win.timeout_s = 0.02
        with pytest.raises(ConnectionError, match=r"board n3 .*no good answer to 5 tries of "
                                                  r"a read of 0x0004 .*5 rejected"):
            win.read(4)
        win.link.close()


def test_a_port_that_fails_under_the_driver_is_a_lost_connection_naming_it() -> None:
    master, slave = os.openpty()
    win = open_window(f"serial:{os.ttyname(slave)}", "board n2")
    os.close(master)  # the adapter unplugged: the port answers with an error
    os.close(slave)
    try:
        with pytest.raises(ConnectionError, match=r"board n2 .*: the serial link failed "
                                                  r"during a read of 0x0008"):
            win.read(8)
    finally:
        win.link.close()


def test_a_refused_write_says_so() -> None:
    with board_side(lambda req, n: S.encode_answer(S.SLVERR, req[2], 0)) as (path, _):
        win = SerialWindow(open_window(f"serial:{path}", "b").link, "board n1")
        with pytest.raises(DeviceRefused, match="write of 0x0000 refused"):
            win.write(0, 1)
        win.link.close()


def test_a_serial_board_that_is_not_there_is_unreachable_naming_it(tmp_path: Path) -> None:
    from oddl.drivers.lab import Unreachable, open_board

    with pytest.raises(Unreachable, match=r"board n2: cannot open .*ttyUSB9"):
        open_board(f"serial:{tmp_path}/ttyUSB9", "n2", ["n0", "n1", "n2"])
    with pytest.raises(Unreachable, match="baud 'x'"):
        open_board("serial:/dev/ttyUSB0?baud=x", "n2", ["n2"])


def test_a_served_testbed_names_every_nodes_board_a_generated_grid_too(root: Path,
                                                                        tmp_path: Path) -> None:
    """`oddl gateware serve` of a generated grid (grid-64: no [[nodes]] in its file) wrote
    nothing: it set each listed node's board, and there were none (a KeyError)."""
    import tomllib

    import tomli_w
    from oddl.app.cli.gateware import served_testbed
    from oddl.controller.base.config import load_testbed

    for name in ("grid-64", "prototype-4node"):
        f = root / "hw_configs" / f"{name}.toml"
        tb = load_testbed(f)
        ports = [f"/dev/pts/{i}" for i in range(len(tb.nodes))]
        (tmp_path / "lab.toml").write_text(tomli_w.dumps(served_testbed(
            tomllib.loads(f.read_text()), tb, ports)))
        lab = load_testbed(tmp_path / "lab.toml")
        assert [n.board for n in lab.nodes] == [f"serial:{p}" for p in ports]
        assert [n.id for n in lab.nodes] == [n.id for n in tb.nodes]
        assert (lab.testbed.control_model, lab.acceptance.design_version) == ("board", "0.3")


def test_a_baud_rate_the_fabric_cannot_divide_is_refused_before_any_build() -> None:
    r = subprocess.run([sys.executable, "-m", "oddl.app", "gateware", "build", "--function",
                        "--baud", "3000000", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "--baud 3000000: 50 MHz does not divide to it" in r.stderr
    assert r.stdout == ""


@pytest.mark.verilator
@pytest.mark.realtime  # a Verilated design behind a pty
def test_the_serial_onic_is_driven_through_its_uart_as_a_lab_drives_the_board() -> None:
    from oddl.drivers.lab import open_board
    from oddl.sim.devices import serial_rtl

    [board] = serial_rtl.start()
    try:
        drv = open_board(f"serial:{board.path}", "n0", ["n0"])
        ident = drv.identity()
        assert (ident["magic"], ident["design_version"]) == (R.MAGIC, R.TOP_DESIGN_VERSION)
        routes = {"n0": ("H", 3, "n0")}
        drv.load_routes(routes)
        assert drv.read_routes() == routes
        # a transfer on H, its light looped back onto H's receiver: counted both ways
        drv.tune_and_start("H", 3, 0, 4096, 77)
        counters = drv.counters("H")
        assert (counters["tx_done"], counters["tx_bytes"], counters["rx_done"],
                counters["rx_bytes"], counters["rx_errors"]) == (1, 4096, 1, 4096, 0), counters
        win = drv.mmio
        # a garbled answer and a garbled request: rejected or unanswered, sent again
        before = dict(win.stats)
        board.noise.garble_answers = 1
        assert drv.identity()["magic"] == R.MAGIC
        board.noise.garble_requests = 1
        board.noise.cut_answers = 1
        drv.load_routes(routes)
        assert drv.read_routes() == routes
        assert win.stats["again"] - before["again"] == 3, win.stats
        assert win.stats["rejected"] - before["rejected"] == 2, win.stats
        assert board.noise.done == {"garbled": 2, "cut": 1}
    finally:
        board.close()


@pytest.mark.verilator
@pytest.mark.realtime  # `oddl gateware serve` and `oddl accept`, each a process of its own
def test_oddl_accept_passes_a_lab_of_serial_onic_boards(root: Path, tmp_path: Path) -> None:
    """A lab's four ECP5 boards as `oddl gateware serve` serves them (serial_onic, Verilated,
    each behind a pty, named `serial:/dev/pts/N` in the testbed file it writes): `oddl
    accept --backend hw` reaches, identifies and reads back every board's registers and
    count-action programs through the bridge, with nothing of oddl's model between the
    driver and the design; the server stops on Ctrl-C."""
    lab = tmp_path / "lab.toml"
    serve = subprocess.Popen([sys.executable, "-m", "oddl.app", "gateware", "serve",
                              str(root / "hw_configs/prototype-4node.toml"), "--out", str(lab)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        lines = []
        for line in serve.stdout:  # (its build: minutes the first time on a machine)
            lines.append(line)
            if line.strip() == "ready":
                break
        assert lines[-1:] == ["ready\n"], "".join(lines) + serve.stderr.read()
        assert sum(line.startswith("board n") for line in lines) == 4
        r = subprocess.run([sys.executable, "-m", "oddl.app", "accept", str(lab), "--backend",
                            "hw", "--report", str(tmp_path / "report"),
                            *(a for c in ("reachable", "identity", "registers", "countaction")
                              for a in ("--only", c))],
                           capture_output=True, text=True, timeout=600)
        serve.send_signal(signal.SIGINT)
        _, err = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            serve.kill()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASS: 16 passed, 0 failed" in r.stdout, r.stdout[-2000:]
    assert serve.returncode == 130 and "Traceback" not in err, err[-2000:]
