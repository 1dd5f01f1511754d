"""The emulated O-NIC as a pynq `Device`, so unmodified pynq code (MMIO) reaches it.

Register access only (`REGISTER_RW`): pynq's MMIO turns reads and writes into
`read_registers` / `write_registers` on the active device, exactly as for a board reached
over a register interface. Boards are registered in process and probed like any pynq device.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from pynq.pl_server.device import Device

from fpga import regmap as R
from sim.onic_board import ONicBoard

BASE_ADDR = 0xA000_0000
_U32 = struct.Struct("<I")  # where the overlay places onic_ctrl (the .hwh says so)


class EmulatedONicDevice(Device):
    _probe_priority_ = 917  # unique among pynq's device classes
    registry: ClassVar[list[EmulatedONicDevice]] = []

    def __init__(self, board: ONicBoard, tag: str | None = None) -> None:
        super().__init__(tag or f"oddl-emu-{board.node}")
        self.board = board
        self.capabilities = {"REGISTER_RW": True}
        self.name = f"oddl emulated O-NIC {board.node}"

    @classmethod
    def _probe_(cls) -> list[EmulatedONicDevice]:
        return list(cls.registry)

    @classmethod
    def register(cls, board: ONicBoard) -> EmulatedONicDevice:
        dev = cls(board)
        cls.registry.append(dev)
        return dev

    def _offset(self, address: int, length: int) -> int:
        off = address - BASE_ADDR
        if off < 0 or off + length > R.IP_RANGE:
            raise MemoryError(f"{self.name}: address 0x{address:X} outside {R.IP_NAME} "
                              f"(0x{BASE_ADDR:X}, 0x{R.IP_RANGE:X})")
        if off % 4 or length % 4:
            raise MemoryError(f"{self.name}: unaligned access at 0x{address:X} ({length} B)")
        return off

    def read_registers(self, address: int, length: int) -> bytes:
        off = address - BASE_ADDR
        if length == 4 and 0 <= off < R.IP_RANGE and not off & 3:  # the common case
            return _U32.pack(self.board.read(off))
        off = self._offset(address, length)
        return b"".join(struct.pack("<I", self.board.read(off + 4 * i))
                        for i in range(length // 4))

    def write_registers(self, address: int, data: bytes) -> None:
        off = self._offset(address, len(data))
        for i, (v,) in enumerate(struct.iter_unpack("<I", data)):
            self.board.write(off + 4 * i, v)
