"""The serial bridge's frames: the O-NIC's register map over a board's USB serial port.

A board with no PS and no PCIe (an ECP5 board, issue 84) is reached through its FTDI: the
host sends a request, the board's bridge (fpga/gateware/serial_bridge.py) runs it as an
AXI-Lite transaction on the register map and answers. Fixed lengths, big-endian fields,
a CRC-8 over all but the sync byte:

    request   A5 | op | seq | addr (2) | data (4) | crc      10 bytes (data 0 on a read)
    answer    5A | status | seq | data (4) | crc            8 bytes

`op`: READ or WRITE; `status`: OKAY or SLVERR (the AXI response). `seq` numbers the
host's transactions: a request sent again (its answer lost or garbled) carries the same
`seq`, and the bridge answers it from the answer it kept, without running it twice (a
write to TX_START or IRQ_STATUS is not idempotent). A request whose CRC is wrong, or cut
short (no byte for `GAP_BITS` bit times), is dropped unanswered; the host times out and
sends it again. Nothing that fails its CRC is ever taken as a register value.
"""

from __future__ import annotations

from dataclasses import dataclass

REQ_SYNC, ANS_SYNC = 0xA5, 0x5A
READ, WRITE = 0x01, 0x02
OKAY, SLVERR = 0x00, 0x02
REQ_LEN, ANS_LEN = 10, 8
CRC_POLY = 0x07  # CRC-8 (SMBus): x^8 + x^2 + x + 1, initial 0
GAP_BITS = 40  # a request's bytes follow each other within this many bit times
BAUD = 2_000_000  # the default: exact from a 50 MHz fabric (25 clocks a bit) and an FTDI's divisors


def crc8(data: bytes, crc: int = 0) -> int:
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ CRC_POLY) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def request(op: int, seq: int, addr: int, data: int = 0) -> bytes:
    body = bytes([op, seq & 0xFF]) + (addr & 0xFFFF).to_bytes(2, "big") + \
        (data & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes([REQ_SYNC]) + body + bytes([crc8(body)])


@dataclass(frozen=True)
class Answer:
    status: int
    seq: int
    data: int


class BadFrame(ValueError):
    """An answer that is no answer: wrong sync, length or CRC."""


def answer(frame: bytes) -> Answer:
    """An answer's fields, or BadFrame saying why."""
    if len(frame) != ANS_LEN:
        raise BadFrame(f"{len(frame)} bytes, not {ANS_LEN}")
    if frame[0] != ANS_SYNC:
        raise BadFrame(f"sync 0x{frame[0]:02X}, not 0x{ANS_SYNC:02X}")
    if crc8(frame[1:-1]) != frame[-1]:
        raise BadFrame(f"CRC 0x{frame[-1]:02X}, not 0x{crc8(frame[1:-1]):02X}")
    return Answer(frame[1], frame[2], int.from_bytes(frame[3:7], "big"))


def encode_answer(status: int, seq: int, data: int) -> bytes:
    """(What the bridge sends: for the tests that play a board's side.)"""
    body = bytes([status, seq & 0xFF]) + (data & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes([ANS_SYNC]) + body + bytes([crc8(body)])
