"""The emulated O-NIC through unmodified pynq MMIO, and the driver's exact register traffic."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager

import pynq
import pytest
from oddl.controller.base.devices import DeviceRefused
from oddl.drivers.onic import IdentityMismatch, ONicDriver
from oddl.fpga import regmap as R
from oddl.fpga.countaction import Program, collective_steps, streamer
from oddl.sim.devices.onic_board import PLACEHOLDER_HASH, ONicBoard
from oddl.sim.devices.pynq_device import BASE_ADDR, EmulatedONicDevice

from tests.helpers import Bench


def test_identity_block_through_pynq() -> None:
    b = Bench()
    ident = b.drv[0].check_identity(bitstream_hash=PLACEHOLDER_HASH.hex())
    assert ident["magic"] == R.MAGIC and ident["node_id"] == 0
    assert b.drv[2].identity()["node_id"] == 2


def test_wrong_design_version_is_a_clear_error() -> None:
    b = Bench(design_version=(0 << 16) | 9)
    with pytest.raises(IdentityMismatch, match=r"design version 0\.9 \(0x00000009\), driver "
                                               r"expects 0\.1"):
        b.drv[0].check_identity()
    with pytest.raises(IdentityMismatch, match="bitstream hash"):
        Bench().drv[0].check_identity(bitstream_hash="00" * 32)


def test_every_register_reads_its_reset_at_power_on() -> None:
    """Every register of the map reads as the map says at power-on, whichever way the
    model holds it: as a word (CAPS among them, though its name starts as a count-action
    module's), a module's field (CAn_...), or computed (status, the timestamp)."""
    m = Bench().mmio[1]
    computed = {"MAGIC", "DESIGN_VERSION", "NODE_ID", "TS_LO", "TS_HI"} | {
        f"BITSTREAM_HASH{i}" for i in range(8)}
    for reg in R.REGISTERS:
        if reg.name not in computed and not reg.name.startswith("CU_"):
            assert m.read(reg.offset) == (0 if reg.access == "SC" else reg.reset), reg.name
    assert m.read(R.BY_NAME["CAPS"].offset) == \
        len(R.PORTS) | R.N_CHANNELS << 8 | R.N_MODULES << 16


def test_access_semantics() -> None:
    b = Bench()
    m = b.mmio[0]
    with pytest.raises(DeviceRefused, match="MAGIC is read-only"):
        m.write(R.BY_NAME["MAGIC"].offset, 1)
    assert m.read(R.BY_NAME["MAGIC"].offset) == R.MAGIC
    m.write(R.BY_NAME["IRQ_ENABLE"].offset, 0xA5)  # RW
    assert m.read(R.BY_NAME["IRQ_ENABLE"].offset) == 0xA5
    assert m.read(R.BY_NAME["TXH_START"].offset) == 0  # SC reads 0
    b.boards[0].regs[R.BY_NAME["ERROR"].offset] = 0b1011  # W1C
    m.write(R.BY_NAME["ERROR"].offset, 0b0010)
    assert m.read(R.BY_NAME["ERROR"].offset) == 0b1001
    with pytest.raises(MemoryError, match="unaligned"):
        b.devs[0].read_registers(BASE_ADDR + 2, 4)
    with pytest.raises(MemoryError, match="outside onic_ctrl"):
        b.devs[0].read_registers(BASE_ADDR + R.IP_RANGE, 4)


def test_tuning_takes_its_time_and_refuses_transfers_meanwhile() -> None:
    b = Bench()
    d = b.drv[0]
    t0 = d.timestamp_ns()
    d.tune("H", 2)
    assert d.tx_status("H") == {"tuning": True, "sending": False, "tuned": False, "channel": 0}
    with pytest.raises(DeviceRefused, match="transfer refused"):
        d.start_transfer("H", 3, 1000, 7)
    assert b.mmio[0].read(R.BY_NAME["ERROR"].offset) == 0  # the driver cleared the flag
    b.run_ns(11)
    assert d.tx_status("H") == {"tuning": False, "sending": False, "tuned": True, "channel": 2}
    assert d.last_tune_ns("H") == 11  # 10.5 ns, on a 1 ns clock
    assert d.timestamp_ns() - t0 == 11
    b.grant(0, 3, 7, 2, 125_000)
    d.start_transfer("H", 3, 125_000, 7)  # 10 us on the wire
    assert d.tx_status("H")["sending"]
    b.run_ns(20_000)
    assert d.counters("H")["tx_done"] == 1 and d.counters("H")["tx_bytes"] == 125_000
    rx = b.drv[3].counters("H")
    assert (rx["rx_done"], rx["rx_bytes"], rx["rx_src"]) == (1, 125_000, 0)
    assert b.st.checker.violations == []


def test_count_action_fires_exactly_at_target_then_disarms() -> None:
    b = Bench()
    prog = Program()
    prog.module("got2", 2).count("rx.transfers", "H", 0).act("irq")
    b.drv[1].load_countaction(prog)
    assert b.drv[1].read_countaction(["got2"]).modules == prog.modules
    d0 = b.drv[0]
    d0.tune("H", 0)  # channel 0: node 0 -> node 1
    b.run_ns(11)
    for k in range(3):
        b.grant(0, 1, k, 0)
        d0.start_transfer("H", 1, 1000, k)
        b.run_ns(200)
        st = b.drv[1].ca_status(0)
        assert st["fired"] == (k >= 1)
        assert st["count"] == min(k + 1, 2)  # disarmed after firing: the third is not counted
        assert st["armed"] == (k == 0)
    assert b.drv[1].irq_status() & (1 << R.IRQ_BITS["CA_FIRED"])
    b.mmio[1].write(R.CA_BASE + 0x04, 1)  # RESET
    assert b.drv[1].ca_status(0) == {"armed": False, "fired": False, "fire_count": 0,
                                     "count": 0}


def test_auto_rearm_and_source_filter() -> None:
    b = Bench()
    prog = Program()
    prog.module("every2", 2, auto_rearm=True).count("rx.transfers", "H", 3)
    b.drv[1].load_countaction(prog)
    d0, d3 = b.drv[0], b.drv[3]
    d0.tune("H", 0)  # 0 -> 1
    d3.tune("H", 1)  # 3 -> 1
    b.run_ns(11)
    for k in range(5):
        b.grant(0, 1, 100 + k, 0)
        d0.start_transfer("H", 1, 100, 100 + k)  # filtered out: from node 0
        b.run_ns(200)
        b.grant(3, 1, k, 1)
        d3.start_transfer("H", 1, 100, k)
        b.run_ns(200)
    st = b.drv[1].ca_status(0)
    assert (st["armed"], st["fire_count"], st["count"]) == (True, 2, 1)


def test_step_program_tunes_and_starts_the_next_transfer() -> None:
    """The collective-step action: on the last byte from the partner, tune and send on."""
    b = Bench()
    # node 1 waits for 4000 bytes from node 0, then tunes H to channel 1 (1 -> 3) and starts
    b.drv[1].load_countaction(collective_steps([("H", 0, 4000, "H", 1)]))
    b.mmio[1].write(R.BY_NAME["TXH_DST"].offset, 3)
    b.mmio[1].write(R.BY_NAME["TXH_BYTES"].offset, 500)
    b.mmio[1].write(R.BY_NAME["TXH_FLOW"].offset, 99)
    b.grant(1, 3, 99, 1, 500)
    b.drv[0].tune("H", 0)
    b.run_ns(11)
    b.grant(0, 1, 1, 0, 4000)
    b.drv[0].start_transfer("H", 1, 4000, 1)  # 320 ns + 50 ns propagation
    b.run_ns(371)
    assert b.drv[1].tx_status("H")["tuning"]  # fired at arrival: now tuning
    b.run_ns(11 + 40 + 2 + 50)
    assert b.drv[3].counters("H")["rx_bytes"] == 500
    assert b.st.checker.violations == []


def test_synchronized_data_streamer_gate() -> None:
    b = Bench()
    b.drv[0].load_countaction(streamer(3))
    board = b.boards[0]
    board.set_dac_valid(1)
    board.set_dac_valid(2)
    assert board.streamed == []  # one DAC not ready: nothing streams
    board.set_dac_valid(3)
    assert [d for _, d in board.streamed] == [1, 2, 3]


class Recording(EmulatedONicDevice):
    """Records every register transaction, as PYNQ's mock devices do."""

    def __init__(self, board: ONicBoard) -> None:
        super().__init__(board, "recording")
        self.capabilities = {"REGISTER_RW": True}  # pynq's register path: every call seen
        self.log: list[tuple[str, int, int]] = []  # one entry per 32-bit word
        self.calls: list[str] = []  # one entry per device call

    def read_registers(self, address: int, length: int) -> bytes:
        data = super().read_registers(address, length)
        self.calls.append(f"read {length} B")
        for i, (v,) in enumerate(struct.iter_unpack("<I", data)):
            self.log.append(("r", address - BASE_ADDR + 4 * i, v))
        return data

    def write_registers(self, address: int, data: bytes) -> None:
        self.calls.append(f"write {len(data)} B")
        for i, (v,) in enumerate(struct.iter_unpack("<I", data)):
            self.log.append(("w", address - BASE_ADDR + 4 * i, v))
        super().write_registers(address, data)

    @contextmanager
    def expect(self, transactions: list[tuple[str, str | int, int | None]]) -> Iterator[None]:
        self.log.clear()
        yield
        want = [(k, R.BY_NAME[n].offset if isinstance(n, str) else n, v)
                for k, n, v in transactions]
        got = [(k, o, v if w is not None else None)
               for (k, o, v), (_, _, w) in zip(self.log, want, strict=False)]
        assert got == want, f"\n got  {self.log}\n want {want}"
        assert len(self.log) == len(want)


@pytest.fixture
def rec() -> tuple[Bench, Recording, ONicDriver]:
    b = Bench()
    dev = Recording(b.boards[0])
    return b, dev, ONicDriver(pynq.MMIO(BASE_ADDR, R.IP_RANGE, device=dev), "n0-0",
                              b.grid.nodes)


def test_driver_tune_transactions(rec: tuple[Bench, Recording, ONicDriver]) -> None:
    _, dev, drv = rec
    with dev.expect([("w", "TXV_CHANNEL", 5), ("w", "TXV_CMD", 1)]):
        drv.tune("V", 5)
    assert dev.calls == ["write 8 B"]


def test_driver_start_transactions(rec: tuple[Bench, Recording, ONicDriver]) -> None:
    b, dev, drv = rec
    drv.tune("H", 1)
    b.run_ns(11)
    b.grant(0, 2, 0x1_0000_0007 & 0xFFFFFFFF, 1)
    block = [("w", "TXH_DST", 2), ("w", "TXH_BYTES", 4096), ("w", "TXH_FLOW", 7),
             *[("w", f"TXH_HDR{i}", v) for i, v in enumerate((1, 0, 3 | 5 << 8, 9, 11, 0))]]
    with dev.expect([*block, ("w", "TXH_START", 1), ("r", "ERROR", 0)]):
        drv.start_transfer("H", 2, 4096, 0x1_0000_0007, (1, 0, 3 | 5 << 8, 9, 11, 0))
    assert dev.calls[-3:] == ["write 36 B", "write 4 B", "read 4 B"]  # one block write


def test_driver_refused_start_transactions(rec: tuple[Bench, Recording, ONicDriver]) -> None:
    _, dev, drv = rec
    drv.tune("H", 1)  # still tuning
    bit = 1 << R.ERROR_BITS["TX_REFUSED_H"]
    with dev.expect([("w", "TXH_DST", 2), ("w", "TXH_BYTES", 8), ("w", "TXH_FLOW", 1),
                     *[("w", f"TXH_HDR{i}", 0) for i in range(6)],
                     ("w", "TXH_START", 1), ("r", "ERROR", bit), ("w", "ERROR", bit)]), \
            pytest.raises(DeviceRefused):
        drv.start_transfer("H", 2, 8, 1)


def test_driver_timestamp_and_identity_transactions(
        rec: tuple[Bench, Recording, ONicDriver]) -> None:
    b, dev, drv = rec
    b.run_ns(5_000_000_123)
    lo = (5_000_000_123) & 0xFFFFFFFF
    with dev.expect([("r", "TS_LO", lo), ("r", "TS_HI", 1)]):
        assert drv.timestamp_ns() == 5_000_000_123
    with dev.expect([("r", "MAGIC", R.MAGIC), ("r", "DESIGN_VERSION", R.DESIGN_VERSION),
                     *[("r", f"BITSTREAM_HASH{i}", None) for i in range(8)],
                     ("r", "NODE_ID", 0)]):
        drv.identity()


def test_driver_routes_round_trip_and_transactions(
        rec: tuple[Bench, Recording, ONicDriver]) -> None:
    _, dev, drv = rec
    routes = {"n0-1": ("H", 0, "n0-1"), "n0-3": ("H", 2, "n0-3")}
    w = [R.route_words(1, "H", 0, 1), R.route_words(3, "H", 2, 3)]
    with dev.expect([("w", R.ROUTE_BASE, w[0][0]), ("w", R.ROUTE_BASE + 4, w[0][1]),
                     ("w", R.ROUTE_BASE + 8, w[1][0]), ("w", R.ROUTE_BASE + 12, w[1][1]),
                     ("w", R.ROUTE_BASE + 16, 0)]):
        drv.load_routes(routes)
    assert drv.read_routes() == routes


def test_a_route_to_no_node_is_refused_by_name_and_writes_nothing(
        rec: tuple[Bench, Recording, ONicDriver]) -> None:
    """Reproducer (issue 43): a node program with `board = "local"` given a route to a node
    that does not exist failed with just "'n9-9'" (a KeyError), part-way through writing."""
    from oddl.controller.base.devices import DeviceRefused

    _, dev, drv = rec
    with dev.expect([]), pytest.raises(DeviceRefused, match=r"a route to n9-9 \(next hop "
                                                          r"n0-1\): n9-9 is no node"):
        drv.load_routes({"n0-1": ("H", 0, "n0-1"), "n9-9": ("H", 1, "n0-1")})


def test_delivered_counts_only_the_final_leg() -> None:
    from oddl.controller.base.messages import Flow as F
    from oddl.fpga.countaction import step_sync

    b = Bench()
    b.drv[1].load_countaction(step_sync([300]))
    board = b.boards[1]
    # a relay leg through n0-1 (final destination n0-3) must not count toward n0-1's step
    board._rx_done("H", F(5, "n0-0", "n0-3", 200, 0, 0, 0))
    assert b.drv[1].ca_status(0)["count"] == 0
    board._rx_done("H", F(6, "n0-0", "n0-1", 300, 0, 0, 0))
    st = b.drv[1].ca_status(0)
    assert (st["fired"], st["fire_count"], st["armed"], st["count"]) == (True, 1, True, 0)


def test_tune_then_start_sends_on_lock_but_plain_start_is_still_refused() -> None:
    b = Bench()
    d = b.drv[0]
    d.tune("H", 0)
    with pytest.raises(DeviceRefused):  # the host may not start while the laser tunes
        d.start_transfer("H", 1, 1000, 1)
    b.run_ns(11)
    b.grant(0, 2, 2, 1, 1250)
    t0 = d.timestamp_ns()
    d.tune_and_start("H", 1, 2, 1250, 2)  # sequenced by the board: sends once locked
    assert d.tx_status("H") == {"tuning": True, "sending": False, "tuned": False, "channel": 0}
    b.run_ns(11)
    assert d.tx_status("H")["sending"] and d.last_tune_ns("H") == 11
    b.run_ns(200)
    rx = b.drv[2].counters("H")
    assert (rx["rx_done"], rx["rx_bytes"]) == (1, 1250)
    assert d.timestamp_ns() - t0 == 211
    assert b.st.checker.violations == []


def test_driver_tune_and_start_transactions(rec: tuple[Bench, Recording, ONicDriver]) -> None:
    _, dev, drv = rec
    with dev.expect([("w", "TXH_DST", 3), ("w", "TXH_BYTES", 64), ("w", "TXH_FLOW", 9),
                     *[("w", f"TXH_HDR{i}", 0) for i in range(6)],
                     ("w", "TXH_CHANNEL", 2), ("w", "TXH_CMD", 3), ("r", "ERROR", 0)]):
        drv.tune_and_start("H", 2, 3, 64, 9)
    assert dev.calls == ["write 36 B", "write 8 B", "read 4 B"]


def test_a_testbeds_boards_and_drivers_share_one_node_index() -> None:
    """Reproducer (issue 32): each driver and board built its own node -> NODE_ID map and
    node list, 16 M entries at 4,096 nodes (1.1 GB of a 1.6 GB run)."""
    from oddl.controller.base.clock import Clock
    from oddl.controller.base.topology import Grid
    from oddl.sim.backend import build
    from oddl.sim.clock import VirtualClockLoop

    from tests.helpers import make_testbed

    tb = make_testbed(3, 3)
    world = build(tb, Grid.from_testbed(tb), Clock(VirtualClockLoop()))
    drivers = [o.d for o in world.onics.values()]
    boards = list(world.boards.values())
    assert len({id(d.index) for d in drivers} | {id(o.index) for o in world.onics.values()}
               | {id(b.index) for b in boards}) == 1
    assert len({id(b.nodes) for b in boards} | {id(d.nodes) for d in drivers}) == 1
    assert drivers[4].index["n1-1"] == 4 and boards[4].nodes[4] == "n1-1"


def test_a_program_loaded_disarms_what_the_one_before_armed() -> None:
    """Reproducer (issue 85): a 7-module program, then a 2-module one: modules 2..6 of the
    first stayed armed and fired into the second's (Lightning's layers reset)."""
    b = Bench()
    deep = Program()
    for k in range(7):
        deep.module(f"m{k}", 2).count("rx.transfers", "H", 0).act("irq")
    b.drv[1].load_countaction(deep)
    assert all(b.drv[1].ca_status(k)["armed"] for k in range(7))
    shallow = Program()
    for k in range(2):
        shallow.module(f"s{k}", 5).count("rx.transfers", "H", 0).act("irq")
    b.drv[1].load_countaction(shallow)
    assert [b.drv[1].ca_status(k)["armed"] for k in range(R.N_MODULES)] == \
        [True, True] + [False] * (R.N_MODULES - 2)
    d0 = b.drv[0]
    d0.tune("H", 0)
    b.run_ns(11)
    b.grant(0, 1, 1, 0)
    d0.start_transfer("H", 1, 1000, 1)
    b.run_ns(200)
    assert [b.drv[1].ca_status(k)["count"] for k in range(7)] == [1, 1, 0, 0, 0, 0, 0]
