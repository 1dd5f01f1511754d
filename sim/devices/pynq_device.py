"""The emulated O-NIC as a pynq `Device`, so unmodified pynq code (MMIO) reaches it.

Memory-mapped, as pynq sees a Zynq board's PL (`MEMORY_MAPPED`): `mmap` returns a window
whose loads and stores reach the board model one 32-bit word at a time (read-to-clear,
write-1-to-clear, commands), so pynq's MMIO runs its memory-mapped path, as on a board.
`read_registers` / `write_registers` (`REGISTER_RW`) serve the PYNQ.remote server and
the transaction-recording tests. Boards are registered in process and probed like any
pynq device.
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np
from oddl.fpga import regmap as R
from oddl.sim.devices.onic_board import ONicBoard
from pynq.pl_server.device import Device

BASE_ADDR = 0xA000_0000
_U32 = struct.Struct("<I")  # where the overlay places onic_ctrl (the .hwh says so)


# The Zynq UltraScale+ PS clock blocks pynq programs when an overlay is downloaded (CRL_APB,
# CRF_APB), with reset values of a typical board: 33.333 MHz reference, IOPLL 1500 MHz,
# RPLL 1200, APLL 1200, DPLL 1050, VPLL 1500; PL0 at 100 MHz.
_PS_BLOCKS = {0xFF5E0000: 0x100, 0xFD1A0000: 0x100}


def _pll(fbdiv: int) -> int:
    return (fbdiv << 8) | (1 << 16)  # DIV2 set, PRE_SRC 0


_PS_RESET = {
    0xFF5E0020: _pll(90), 0xFF5E0030: _pll(72),  # IOPLL_CTRL, RPLL_CTRL
    **{0xFF5E00C0 + 4 * i: (1 << 24) | (1 << 16) | (15 << 8) for i in range(4)},  # PLx_REF
    0xFD1A0020: _pll(72), 0xFD1A002C: _pll(63), 0xFD1A0038: _pll(90),  # APLL, DPLL, VPLL
    0xFD1A0060: (1 << 8),  # ACPU_CTRL: divisor 1 from APLL
}


class EmulatedONicDevice(Device):
    _probe_priority_ = 917  # unique among pynq's device classes
    registry: ClassVar[list[EmulatedONicDevice]] = []
    arch = "aarch64"  # a Zynq UltraScale+ board, as far as pynq's clock code is concerned

    def __init__(self, board: ONicBoard, tag: str | None = None) -> None:
        super().__init__(tag or f"oddl-emu-{board.node}")
        self.board = board
        self.capabilities = {"MEMORY_MAPPED": True, "REGISTER_RW": True}
        self.name = f"oddl emulated O-NIC {board.node}"
        # plain storage, as numpy arrays: pynq lays its clock RegisterMaps over them
        self.ps_mem = {b: np.zeros(n // 4, dtype=np.uint32) for b, n in _PS_BLOCKS.items()}
        for a, v in _PS_RESET.items():
            mem, i = self._ps_word(a)
            mem[i] = v

    @staticmethod
    def _in_ps(address: int) -> bool:
        return any(b <= address < b + n for b, n in _PS_BLOCKS.items())

    def _ps_word(self, address: int) -> tuple[np.ndarray, int]:
        for b, n in _PS_BLOCKS.items():
            if b <= address < b + n and not address & 3:
                return self.ps_mem[b], (address - b) // 4
        raise MemoryError(f"{self.name}: 0x{address:X} is not a PS register this board has")

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

    def mmap(self, base_addr: int, length: int) -> _Window:
        if self._in_ps(base_addr):
            mem, i = self._ps_word(base_addr)
            if i + length // 4 > len(mem):
                raise MemoryError(f"{self.name}: 0x{base_addr:X} + {length} B leaves its block")
            # (type: ignore below: a memoryview of words: what pynq reads)
            return mem[i:i + length // 4]  # type: ignore[return-value]
        return _Window(self.board, self._offset(base_addr, length), length)

    def read_registers(self, address: int, length: int) -> bytes:
        off = address - BASE_ADDR
        if length == 4 and 0 <= off < R.IP_RANGE and not off & 3:  # the common case
            return _U32.pack(self.board.read(off))
        if self._in_ps(address):
            return b"".join(_U32.pack(int(m[i])) for m, i in
                            (self._ps_word(address + 4 * k) for k in range(length // 4)))
        off = self._offset(address, length)
        return b"".join(struct.pack("<I", self.board.read(off + 4 * i))
                        for i in range(length // 4))

    def write_registers(self, address: int, data: bytes) -> None:
        off = address - BASE_ADDR
        if off >= 0 and off + len(data) <= R.IP_RANGE and not off & 3 and not len(data) & 3:
            board = self.board
            for i, (v,) in enumerate(struct.iter_unpack("<I", data)):
                board.write(off + 4 * i, v)
            return
        if self._in_ps(address):
            for i, (v,) in enumerate(struct.iter_unpack("<I", data)):
                m, j = self._ps_word(address + 4 * i)
                m[j] = v
            return
        off = self._offset(address, len(data))
        for i, (v,) in enumerate(struct.iter_unpack("<I", data)):
            self.board.write(off + 4 * i, v)


def _metadata(bitfile_name: str):
    from pathlib import Path

    from pynqmetadata.frontends import Metadata
    from pynqmetadata.views.runtime.runtime_metadata_parser import RuntimeMetadataParser

    hwh = Path(bitfile_name).with_suffix(".hwh")
    if not hwh.is_file():
        raise FileNotFoundError(f"no overlay metadata {hwh} beside {bitfile_name}")
    return RuntimeMetadataParser(Metadata(input=str(hwh)))


def _download(self: EmulatedONicDevice, bitstream, parser=None) -> None:
    """'Configure' the emulated FPGA: the hash register takes the bitstream's SHA-256."""
    from oddl.fpga.overlay import bitstream_hash

    self.board.load_bitstream_hash(bitstream_hash(bitstream.bitfile_name))
    self.board.loaded_bitstream = bitstream.bitfile_name
    self.post_download(bitstream, parser)


EmulatedONicDevice.get_bitfile_metadata = lambda self, name: _metadata(name)
EmulatedONicDevice.download = _download


class _Window:
    """32-bit words of onic_ctrl, as pynq's MMIO indexes a mapped array."""

    __slots__ = ("board", "first", "words")

    def __init__(self, board: ONicBoard, offset: int, length: int) -> None:
        self.board, self.first, self.words = board, offset, length // 4

    def __len__(self) -> int:
        return self.words

    def _at(self, idx: int) -> int:
        if not 0 <= idx < self.words:
            raise MemoryError(f"word {idx} outside the mapped window of {self.words} words")
        return self.first + 4 * idx

    def __getitem__(self, idx: int) -> int:
        if not 0 <= idx < self.words:
            self._at(idx)  # raises
        return self.board.read(self.first + 4 * idx)

    def __setitem__(self, idx: int, value: int) -> None:
        if not 0 <= idx < self.words:
            self._at(idx)  # raises
        self.board.write(self.first + 4 * idx, int(value) & 0xFFFFFFFF)

