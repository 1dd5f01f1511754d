"""Open the devices an emu or hw testbed config names, with the drivers a lab runs.

Boards through pynq (PYNQ.remote `grpc://HOST:PORT`, or `local`), WSSs through pyserial,
the control bus through MQTT. PYNQ.remote carries no interrupts, so each board's
interrupt status register is polled from a thread, which hands the interrupt to the
controller's loop the way `pynq.Interrupt` would wake it on the board.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from oddl.controller.config import Testbed
from oddl.controller.topology import Grid
from oddl.drivers.onic import DriverONic, ONicDriver
from oddl.fpga import regmap as R


@dataclass
class Devices:
    onics: dict[str, DriverONic]
    wss: dict[str, Any]
    bus: Any
    pollers: list[threading.Thread] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.stop.set()
        for t in self.pollers:
            t.join(2)
        for w in self.wss.values():
            w.close()


def _ports(grid: Grid, node: str) -> tuple[str, ...]:
    return tuple(p for p in ("H", "V") if grid.group_of(node, p).wss)


POLL_S = 0.005  # between polls of an idle board: a poll is a gRPC round trip the board
# (or the emulator, which also runs the broker) must serve; flat out, 4 pollers starve it


def _poll(onic: DriverONic, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
    """The interrupt line: wake the loop when IRQ_STATUS shows an enabled event; wait for
    the loop to have handled it (it reads and clears the register itself)."""
    off = R.BY_NAME["IRQ_STATUS"].offset
    mmio = onic.d.mmio
    handled = threading.Event()

    def deliver() -> None:
        try:
            onic.on_interrupt()
        finally:
            handled.set()

    while not stop.is_set():
        if mmio.read(off):
            handled.clear()
            loop.call_soon_threadsafe(deliver)
            handled.wait(1.0)
        else:
            stop.wait(POLL_S)


class Unreachable(RuntimeError):
    """A board the config names that cannot be reached (the message says why)."""


def open_board(addr: str | None, node: str, nodes: list[str]) -> Any:
    """An ONicDriver on a board address: grpc://HOST:PORT (PYNQ.remote) or `local` (this
    host's PL, when the suite runs on the board itself)."""
    from pynq import MMIO

    if addr and addr.startswith("grpc://"):
        from pynq.pl_server.remote_device import RemoteDevice

        host, _, port = addr.removeprefix("grpc://").rpartition(":")
        device = RemoteDevice(0, host, port=int(port))
    elif addr == "local":
        from pynq import Device

        device = Device.active_device
    else:
        raise Unreachable(f"board address {addr!r} is neither grpc://HOST:PORT nor 'local'")
    drv = ONicDriver(MMIO(R.IP_BASE, R.IP_RANGE, device=device), node, nodes)
    drv.mmio.read(R.BY_NAME["MAGIC"].offset)  # it answers a register read
    return drv


async def open_devices(tb: Testbed, grid: Grid, tap: Any = None) -> Devices:
    from oddl.drivers.mqtt import bus_from_config
    from oddl.drivers.wss import WSSDriver

    nodes = list(grid.nodes)
    addr = {n.id: n.board for n in tb.nodes}
    onics = {}
    for n in nodes:
        drv = await asyncio.to_thread(open_board, addr[n], n, nodes)
        drv.check_identity()
        onics[n] = DriverONic(drv, _ports(grid, n))
    wss = {}
    for w in tb.wss:
        if not w.serial:
            raise ValueError(f"WSS {w.id}: no serial port in the testbed config")
        wss[w.id] = WSSDriver(w.serial)
    return Devices(onics, wss, bus_from_config(tb.name, tb.broker, tap=tap))


def start_pollers(dev: Devices, loop: asyncio.AbstractEventLoop) -> None:
    for n, onic in dev.onics.items():
        t = threading.Thread(target=_poll, args=(onic, loop, dev.stop), daemon=True,
                             name=f"irq-{n}")
        t.start()
        dev.pollers.append(t)
