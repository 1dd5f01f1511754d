"""A board's register map over its USB serial port (`serial:PORT[?baud=B]`, issue 84).

The ECP5 build of the O-NIC (fpga/gateware/serial_top.py) has no PS and no PCIe: its
serial bridge runs each request as an AXI-Lite transaction (fpga/serial_frames.py). This
is the host's side, with pyserial: `SerialWindow` is a `RegisterWindow` as pynq's MMIO is,
so the O-NIC driver, `oddl accept` and `oddl node` drive the board unchanged.

An answer that is no answer (wrong sync, CRC or length, another request's sequence
number) is rejected and counted, never taken as a register value; the request goes again
with its sequence number, and the bridge answers it from the answer it kept (a write runs
once). A board that answers none of `tries` tries is a lost connection (ConnectionError, as
PYNQ.remote's), said with the counts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from oddl.controller.base.devices import DeviceRefused
from oddl.fpga import serial_frames as S

TIMEOUT_S = 0.25  # an answer's wait: a USB serial adapter's latency timer is up to 16 ms
TRIES = 5
MAX_BAUD = 12_000_000  # an FTDI FT2232H's highest
# what a port that fails under pyserial raises (its reads and writes: OSError; its
# buffers' flush on POSIX: termios.error, which is not one)
LINK_ERRORS: tuple[type[BaseException], ...] = (OSError,)
with contextlib.suppress(ImportError):
    import termios

    LINK_ERRORS += (termios.error,)


def parse_address(addr: str) -> tuple[str, int]:
    """`serial:PORT[?baud=B]` -> (port, baud); ValueError saying what is wrong."""
    if not addr.startswith("serial:"):
        raise ValueError(f"{addr!r} is not serial:PORT[?baud=B]")
    parts = urlsplit(addr.removeprefix("serial:"))
    port = parts.path
    if not port or len(port) > 256 or "\x00" in port:
        raise ValueError(f"{addr!r}: no port, or not a port's name")
    query = parse_qs(parts.query, strict_parsing=bool(parts.query), max_num_fields=4) \
        if parts.query else {}
    unknown = set(query) - {"baud"}
    if unknown:
        raise ValueError(f"{addr!r}: unknown parameter {sorted(unknown)[0]!r} (only baud)")
    baud = S.BAUD
    if "baud" in query:
        text = query["baud"][-1]
        if not text.isdigit() or not 300 <= int(text) <= MAX_BAUD:
            raise ValueError(f"{addr!r}: baud {text!r} is not a rate from 300 to {MAX_BAUD}")
        baud = int(text)
    return port, baud


class SerialWindow:
    """pynq MMIO's `read`/`write`, each word one request and its answer on the serial
    port. `stats`: requests, tries sent again, answers rejected."""

    def __init__(self, link: Any, name: str, timeout_s: float = TIMEOUT_S,
                 tries: int = TRIES) -> None:
        self.link, self.name = link, name
        self.timeout_s, self.tries = timeout_s, tries
        self.seq = 0
        self.stats = {"requests": 0, "again": 0, "rejected": 0}
        self._lock = threading.Lock()  # one transaction at a time (the heartbeat's thread too)

    def read(self, offset: int = 0, length: int = 4, word_order: str = "little") -> int:
        if length % 4 or not 4 <= length <= 64:
            raise ValueError(f"{self.name}: reads are of 4 to 64 bytes in words, not {length}")
        words = [self._transact(S.READ, offset + 4 * i, 0) for i in range(length // 4)]
        if word_order == "big":
            words.reverse()
        return sum(w << 32 * i for i, w in enumerate(words))

    def write(self, offset: int, data: int | bytes) -> None:
        if isinstance(data, int):
            self._transact(S.WRITE, offset, data)
            return
        if len(data) % 4:
            raise ValueError(f"{self.name}: writes are whole words, not {len(data)} bytes")
        for i in range(0, len(data), 4):
            self._transact(S.WRITE, offset + i, int.from_bytes(data[i: i + 4], "little"))

    def _transact(self, op: int, addr: int, data: int) -> int:
        if not 0 <= addr <= 0xFFFF or addr % 4:
            raise ValueError(f"{self.name}: address 0x{addr:X} is not a word of the map")
        what = f"{'read' if op == S.READ else 'write'} of 0x{addr:04X}"
        with self._lock:
            self.seq = (self.seq + 1) & 0xFF
            frame = S.request(op, self.seq, addr, data)
            self.stats["requests"] += 1
            why = ""
            for k in range(self.tries):
                if k:
                    self.stats["again"] += 1
                try:
                    self.link.reset_input_buffer()  # what is left of an answer given up on
                    self.link.write(frame)
                    got = self._answer()
                except LINK_ERRORS as e:  # the port itself (unplugged): pyserial's errors
                    raise ConnectionError(f"{self.name}: the serial link failed during a "
                                          f"{what}: {e}") from None
                try:
                    ans = S.answer(got)
                except S.BadFrame as e:
                    why = f"no answer in {self.timeout_s:g} s" if not got else str(e)
                    if got:
                        self.stats["rejected"] += 1
                    continue
                if ans.seq != self.seq:
                    self.stats["rejected"] += 1
                    why = f"an answer to request {ans.seq}, not {self.seq}"
                    continue
                if ans.status != S.OKAY:
                    raise DeviceRefused(f"{self.name}: {what} refused (AXI SLVERR)")
                return ans.data
            raise ConnectionError(f"{self.name}: no good answer to {self.tries} tries of a "
                                  f"{what} (the last: {why}; {self.stats['rejected']} "
                                  f"rejected so far)")

    def _answer(self) -> bytes:
        """An answer's bytes, from its sync byte on, or what came before the time ran out."""
        deadline = time.monotonic() + self.timeout_s
        buf = b""
        while len(buf) < S.ANS_LEN:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.link.timeout = left
            chunk = self.link.read(S.ANS_LEN - len(buf))
            if not chunk:
                break
            buf += chunk
            if buf and buf[0] != S.ANS_SYNC:  # noise before the answer: up to its sync
                i = buf.find(bytes([S.ANS_SYNC]))
                buf = buf[i:] if i >= 0 else b""
        return buf


def open_window(addr: str, name: str) -> SerialWindow:
    """The serial port `addr` names, opened with pyserial (raw, 8N1)."""
    import serial

    port, baud = parse_address(addr)
    try:
        link = serial.Serial(port, baud, timeout=TIMEOUT_S, write_timeout=1.0)
    except (serial.SerialException, OSError, ValueError) as e:
        raise ConnectionError(f"{name}: cannot open {port}: {e}") from None
    return SerialWindow(link, f"{name} ({addr})")
