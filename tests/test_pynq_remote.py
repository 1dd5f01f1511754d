"""Unmodified pynq RemoteDevice + MMIO + the O-NIC driver, over gRPC to an emulated board."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from oddl.controller.base.clock import Clock
from oddl.controller.base.devices import DeviceRefused
from oddl.drivers.onic import ONicDriver
from oddl.fpga import regmap as R
from oddl.sim.devices.onic_board import ONicBoard
from oddl.sim.devices.pynq_device import EmulatedONicDevice
from oddl.sim.devices.pynq_remote import RemoteBoardServer
from pynq import MMIO
from pynq.pl_server.remote_device import RemoteDevice

from tests.helpers import make_testbed

pytestmark = pytest.mark.realtime  # brokers, emulators, sockets: the wall clock


class Emulator:
    """The emulator side in its own thread and loop, as `oddl emulate` would run it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        from oddl.controller.base.topology import Grid
        from oddl.sim import backend as sim_backend

        tb = make_testbed(1, 4, wavelengths=3)
        grid = Grid.from_testbed(tb)
        # transfers here are started by hand, with no bus granting them: record, not raise
        st = sim_backend.build(tb, grid, Clock(self.loop), checker_mode="record")
        self.board: ONicBoard = st.boards["n0-0"]
        self.server = RemoteBoardServer(EmulatedONicDevice(self.board))
        self.loop.run_until_complete(self.server.start())
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> Emulator:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator() as e:
        yield e


def test_remote_device_identity_and_registers(emu: Emulator) -> None:
    rd = RemoteDevice(0, "127.0.0.1", port=emu.server.port)
    assert rd.arch == "aarch64" and rd.name == "ODDL-ONIC-EMU"
    drv = ONicDriver(MMIO(R.IP_BASE, R.IP_RANGE, device=rd), "n0-0")
    ident = drv.check_identity()
    assert ident["magic"] == R.MAGIC and ident["node_id"] == 0
    drv.tune("H", 2)  # the 8-byte block write goes through as one gRPC write
    assert emu.board.regs[R.BY_NAME["TXH_CHANNEL"].offset] == 2
    with pytest.raises(RuntimeError, match="MAGIC is read-only"):
        drv.mmio.write(R.BY_NAME["MAGIC"].offset, 1)
    with pytest.raises(RuntimeError, match=r"not supported over PYNQ\.remote"):
        drv.mmio.read(R.BY_NAME["TS_LO"].offset, 8)
    assert emu.server.mmio.ops > 10


def test_remote_refused_start_is_reported(emu: Emulator) -> None:
    rd = RemoteDevice(0, "127.0.0.1", port=emu.server.port)
    drv = ONicDriver(MMIO(R.IP_BASE, R.IP_RANGE, device=rd), "n0-0",
                     ["n0-0", "n0-1", "n0-2", "n0-3"])
    drv.tune("H", 0)
    deadline = time.monotonic() + 5
    while not drv.tx_status("H")["tuned"]:  # the emulator runs in real time: wait for lock
        assert time.monotonic() < deadline
    drv.start_transfer("H", 1, 4_000_000_000, 1)  # 320 ms on the wire at 100 Gb/s: still
    # busy when the next write lands, however loaded the machine running the emulator
    with pytest.raises(DeviceRefused, match="transfer refused"):
        drv.start_transfer("H", 1, 100, 2)  # busy: the board refuses, the driver says so


def test_unmodified_overlay_over_remote_device(emu: Emulator) -> None:
    """pynq.Overlay parses the shipped .bit/.hwh for a RemoteDevice; its onic_ctrl IP is
    the emulated board's register file, and open_onic holds it to the map and identity."""
    import hashlib

    import pynq
    from oddl.drivers.onic import open_onic
    from oddl.fpga.overlay import BITFILE

    rd = RemoteDevice(0, "127.0.0.1", port=emu.server.port)
    ol = pynq.Overlay(str(BITFILE), device=rd, download=False)
    assert ol.ip_dict["onic_ctrl"]["phys_addr"] == R.IP_BASE
    assert ol.onic_ctrl.read(R.BY_NAME["MAGIC"].offset) == R.MAGIC
    drv = open_onic(BITFILE, rd, "n0-0", download=False,
                    bitstream_hash=hashlib.sha256(BITFILE.read_bytes()).hexdigest())
    assert drv.identity()["node_id"] == 0
