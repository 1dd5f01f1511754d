"""The WSS driver against the emulated instrument on a pseudo-terminal (real pyserial)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import build
from oddl.controller.base.config import load_testbed
from oddl.controller.base.devices import DeviceRefused
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.arbiter import Arbiter
from oddl.drivers.wss import WSSDriver, WSSError, WSSProtocolError, WSSTimeout
from oddl.sim import backend as sim_backend
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.devices.wss import WSSModel
from oddl.sim.devices.wss_serial import SerialWSS

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock

GOOD = [[1, 2], [0, 3], [3, 0], [2, 1]]


@pytest.fixture
def inst() -> Iterator[SerialWSS]:
    i = SerialWSS(WSSModel("wss-row0", 4, 2)).start()
    yield i
    i.close()


def test_identify_and_exact_protocol(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path, timeout=1.0)
    assert (d.id, d.ports, d.channels) == ("wss-row0", 4, 2)
    inst.log.clear()
    d.set_table(GOOD)
    assert list(inst.log) == ["ROUT:CLR", "ROUT:ROW 0,1,2", "ROUT:ROW 1,0,3",
                              "ROUT:ROW 2,3,0", "ROUT:ROW 3,2,1", "ROUT:APPL"]
    inst.log.clear()
    assert d.get_table() == GOOD
    assert list(inst.log) == [f"ROUT:ROW? {i}" for i in range(4)]
    assert inst.model.table == GOOD
    d.close()


def test_colliding_table_is_refused_and_old_table_kept(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path)
    d.set_table(GOOD)
    bad = [[1, None], [2, None], [1, None], [0, None]]
    with pytest.raises(DeviceRefused, match=r"inputs 0 and 2 both reach \(out 1, channel 0\)"):
        d.set_table(bad)
    assert d.get_table() == GOOD
    assert d.errors() == [(-221, "wss-row0: inputs 0 and 2 both reach (out 1, channel 0): "
                                 "collision, table refused")]
    assert d.errors() == []
    d.close()


def test_instrument_errors(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path)
    with pytest.raises(WSSError) as ei:
        d.query("ROUT:FOO 1")
    assert ei.value.code == -113 and "unknown command 'ROUT:FOO'" in str(ei.value)
    with pytest.raises(WSSError, match=r"-222 .*output port 9 out of range"):
        d.query("ROUT:ROW 0,9,1")
    with pytest.raises(WSSError, match=r"-109 .*'x' is not a number"):
        d.query("ROUT:ROW 0,x")
    # issue 33, defect 20: Python's int() reads these; the instrument's parser does not
    for row, bad in (("ROUT:ROW 0,+1", "output '+1'"), ("ROUT:ROW +0,1", "input port '+0'"),
                     ("ROUT:ROW 0,1_0", "output '1_0'"), ("ROUT:ROW? 0_0", "input port")):
        with pytest.raises(WSSError, match=rf"-109 .*{re.escape(bad)}.* is not a number"):
            d.query(row)
    d.close()


def test_the_command_log_keeps_the_last_lines_only(inst: SerialWSS) -> None:
    """Reproducer (issue 33, defect 9): 250,000 long lines took the emulator from 188 MB to
    1,155 MB; the instrument keeps the last LOG_LINES of them."""
    from oddl.sim.devices.wss_serial import LOG_LINES

    for k in range(LOG_LINES + 50):
        inst.handle(f"*IDN? {k}".encode())
    assert len(inst.log) == LOG_LINES and inst.log[-1] == f"*IDN? {LOG_LINES + 49}"


def test_garbage_reply_is_a_protocol_error(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path)
    inst.mode = "garbage"
    with pytest.raises(WSSProtocolError, match=r"garbled reply .* to 'ROUT:ROW\? 0'"):
        d.get_table()
    d.close()


def test_noise_on_the_line_is_skipped_and_counted_not_taken_for_the_reply(
        inst: SerialWSS) -> None:
    """Reproducer (issue 33, defect 17): noise on the WSS's serial line read as its answer,
    so the watch's polls failed and the WSS was called dead."""
    d = WSSDriver(inst.path)
    d.set_table(GOOD)
    inst.mode = "noise"
    assert d.get_table() == GOOD
    assert d.garbled == 4  # one line of noise before each of the 4 replies
    d.close()


def test_silence_is_a_timeout_naming_the_command(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path, timeout=0.2)
    inst.mode = "silent"
    with pytest.raises(WSSTimeout, match=r"no reply to '\*IDN\?' within 0.2 s"):
        d.identify()
    d.close()


def test_not_a_wss(tmp_path: Path) -> None:
    inst = SerialWSS(WSSModel("x", 2, 1)).start()
    try:
        inst.handle = lambda raw: "ACME,SCOPE,1234"  # type: ignore[method-assign]
        with pytest.raises(WSSProtocolError, match="is not an oddl WSS identity"):
            WSSDriver(inst.path)
    finally:
        inst.close()


def test_arbiter_applies_the_plan_over_the_serial_line(root: Path) -> None:
    tb = load_testbed(root / "hw_configs" / "prototype-4node.toml")
    grid = Grid.from_testbed(tb)
    inst = SerialWSS(WSSModel("wss-row0", 4, 2)).start()
    try:
        wss = WSSDriver(inst.path)
        loop = VirtualClockLoop()
        st = sim_backend.build(tb, grid, Clock(loop))  # the O-NICs: boards behind pynq
        arb = Arbiter(tb, grid, st.onics, {"wss-row0": wss})
        arb.inventory()
        plan = arb.plan(build("hd", 4, 1000, 1, 4), "matched")
        arb.apply(plan)
        assert inst.model.table == [[1, 2], [0, 3], [3, 0], [2, 1]]
        assert inst.model.applied == 1
        assert st.onics["n0"].read_routes() == {"n1": ("H", 0, "n1"), "n2": ("H", 1, "n2")}
        wss.close()
        loop.close()
    finally:
        inst.close()


def _bounded(fn, limit_s: float = 20.0):  # type: ignore[no-untyped-def]
    """Run fn in a thread; it must return (or raise) within limit_s, never hang the suite."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(_catch(fn)), daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still blocked after {limit_s} s"
    return out[0]


def _catch(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except Exception as e:
        return e


def test_a_device_babbling_without_end_of_line_does_not_hold_the_driver(inst: SerialWSS
                                                                        ) -> None:
    """Reproducer (issue 13): readline()'s time-out is per byte, so a device streaming
    bytes without a newline held `query` for as long as it streamed (30 s observed)."""
    d = WSSDriver(inst.path, timeout=0.2)
    inst.mode = "babble"
    e = _bounded(lambda: d.query("*IDN?"))
    assert isinstance(e, (WSSTimeout, WSSProtocolError)) and "'*IDN?'" in str(e)
    inst.mode = "normal"
    d.close()


def test_an_endless_line_is_dropped_whole_and_the_instrument_answers_on(inst: SerialWSS
                                                                       ) -> None:
    """Reproducer: the emulated WSS buffered an unterminated line quadratically (16 MB took
    25 s). Like a real instrument's input buffer, it now drops an overlong line and says so."""
    d = WSSDriver(inst.path, timeout=5)
    d.ser.write(b"X" * (16 << 20) + b"\n")
    assert d.ser.read_until(b"\n", 200) == b'ERR -363,"Input buffer overrun"\n'
    assert d.query("*IDN?").startswith("ODDL,WSS,wss-row0")
    d.close()


def test_the_error_queue_is_bounded_like_scpi(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path)
    for _ in range(100):
        with pytest.raises(WSSError):
            d.query("NOPE")
    errs = d.errors()
    assert len(errs) == 32 and errs[-1] == (-350, "Queue overflow")
    assert d.errors() == []
    d.close()


def test_a_non_numeric_error_entry_is_a_protocol_error(inst: SerialWSS) -> None:
    d = WSSDriver(inst.path)
    inst.handle = lambda raw: "banana"  # type: ignore[method-assign]
    with pytest.raises(WSSProtocolError, match="no error-queue entry"):
        d.errors()
    d.close()
