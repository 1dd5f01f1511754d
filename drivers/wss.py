"""WSS driver over pyserial, speaking docs/wss-protocol.md (real instrument or emulator)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import serial
from oddl.controller.base.devices import DeviceRefused
from oddl.drivers import cassette

_IDN = re.compile(r"^ODDL,WSS,(?P<id>[^,]+),(?P<ports>\d+)x(?P<channels>\d+),(?P<fw>\S+)$")
_ERR = re.compile(r'^ERR (?P<code>-?\d+),"(?P<text>[^"]*)"$')
BAUDRATE = 115200  # the serial line's rate
MAX_REPLY = 8192  # the longest reply is a row of a 4096-channel table: far less
log = logging.getLogger(__name__)


def _text(raw: bytes) -> str | None:
    """A line as a reply: printable ASCII, stripped; None if it is noise."""
    try:
        reply = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return reply if reply.isprintable() else None


class WSSTimeout(TimeoutError):
    pass


class WSSProtocolError(RuntimeError):
    pass


class WSSError(RuntimeError):
    def __init__(self, code: int, text: str, command: str) -> None:
        self.code, self.text, self.command = code, text, command
        super().__init__(f"WSS error {code} on {command!r}: {text}")


class WSSDriver:
    """`controller.devices.WSSDevice` over a serial line."""

    def __init__(self, port: str | Any, timeout: float = 1.0, baudrate: int = BAUDRATE,
                 settle_s: float = 0.0) -> None:
        """settle_s: how long the switch takes to settle after an apply (its LCoS), beyond
        `timeout`, before it answers (the testbed's `reconfig_ms`)."""
        self.ser = (serial.Serial(port, baudrate=baudrate, timeout=timeout)
                    if isinstance(port, str) else port)
        self.where = port if isinstance(port, str) else getattr(port, "port", "serial")
        self.timeout = timeout
        self.settle_s = settle_s
        self.garbled = 0  # lines of noise skipped
        # one exchange at a time: stage 1 (a worker thread) and the watch (the loop) share it
        self._one = threading.Lock()
        ident = self.identify()
        m = _IDN.match(ident)
        assert m is not None  # identify() validated it
        self.id = m["id"]
        self.ports = int(m["ports"])
        self.channels = int(m["channels"])

    def close(self) -> None:
        self.ser.close()

    def query(self, command: str, settle_s: float = 0.0) -> str:
        """Send one line, read one reply line; ERR replies raise WSSError. Lines that are
        no reply at all (not printable ASCII: noise on the line) are skipped and counted
        (`garbled`), within the one time-out (plus `settle_s`, for an apply)."""
        with self._one:
            if not settle_s:
                return self._query(command)
            base = self.timeout
            self.timeout = self.ser.timeout = base + settle_s
            try:
                return self._query(command)
            finally:
                self.timeout = self.ser.timeout = base

    def _query(self, command: str) -> str:
        self.ser.reset_input_buffer()
        self.ser.write(command.encode("ascii") + b"\n")
        deadline, junk = time.monotonic() + self.timeout, b""
        while True:
            try:
                raw = self._line(command)
            except WSSTimeout:
                if junk:
                    raise WSSProtocolError(f"{self.where}: garbled reply {junk!r} to "
                                           f"{command!r} (only noise within {self.timeout} s)"
                                           ) from None
                raise
            reply = _text(raw)
            if reply is not None:
                break
            self.garbled, junk = self.garbled + 1, raw
            if self.garbled & (self.garbled - 1) == 0:  # 1, 2, 4, ...: noise is not a flood
                log.warning("%s: garbled line %r skipped (%d so far): a noisy serial line?",
                            self.where, raw[:40], self.garbled)
            if time.monotonic() > deadline:
                raise WSSProtocolError(f"{self.where}: garbled reply {raw!r} to {command!r} "
                                       f"(only noise within {self.timeout} s)")
        m = _ERR.match(reply)
        if m:
            raise WSSError(int(m["code"]), m["text"], command)
        if reply.startswith("ERR"):
            raise WSSProtocolError(f"{self.where}: malformed error reply {reply!r}")
        return reply

    def _line(self, command: str) -> bytes:
        # one deadline and one length for the whole line (readline's time-out is per byte:
        # a device streaming bytes without an end of line held it forever)
        raw: bytes = self.ser.read_until(b"\n", MAX_REPLY)
        if not raw:
            raise WSSTimeout(f"{self.where}: no reply to {command!r} within {self.timeout} s")
        if not raw.endswith(b"\n"):
            if len(raw) >= MAX_REPLY:
                raise WSSProtocolError(f"{self.where}: reply to {command!r} longer than "
                                       f"{MAX_REPLY} bytes without an end of line: "
                                       f"{raw[:40]!r}...")
            raise WSSTimeout(f"{self.where}: partial reply {raw[:200]!r} to {command!r} "
                             f"(no end of line within {self.timeout} s)")
        return raw

    def _ok(self, command: str, settle_s: float = 0.0) -> None:
        reply = self.query(command, settle_s)
        if reply != "OK":
            raise WSSProtocolError(f"{self.where}: expected OK to {command!r}, got {reply!r}")

    def identify(self) -> str:
        reply = self.query("*IDN?")
        if not _IDN.match(reply):
            raise WSSProtocolError(f"{self.where}: {reply!r} is not an oddl WSS identity")
        return reply

    def set_table(self, table: list[list[int | None]]) -> None:
        if len(table) > self.ports:
            raise DeviceRefused(f"WSS {self.id}: {len(table)} input rows, {self.ports} ports")
        self._ok("ROUT:CLR")
        self._apply(enumerate(table))

    def set_rows(self, rows: Mapping[int, list[int | None]]) -> None:
        """Stage the applied table, change the named inputs, apply: the others' light
        is left as it is."""
        self._ok("ROUT:COPY")
        self._apply(sorted(rows.items()))

    def _apply(self, rows: Iterable[tuple[int, list[int | None]]]) -> None:
        """Stage these inputs' rows, then apply the staged table."""
        for i, row in rows:
            cells = ",".join("-" if o is None else str(o) for o in row)
            self._ok(f"ROUT:ROW {i},{cells}" if cells else f"ROUT:ROW {i}")
        try:
            self._ok("ROUT:APPL", self.settle_s)
        except WSSError as e:
            if e.code == -221:
                raise DeviceRefused(f"WSS {self.id}: table refused: {e.text}") from e
            raise

    def get_table(self) -> list[list[int | None]]:
        out = []
        for i in range(self.ports):
            reply = self.query(f"ROUT:ROW? {i}")
            try:
                row = [None if c == "-" else int(c) for c in reply.split(",")]
            except ValueError:
                raise WSSProtocolError(f"{self.where}: bad row reply {reply!r} for input {i}") \
                    from None
            if len(row) != self.channels or any(o is not None and not 0 <= o < self.ports
                                                for o in row):
                raise WSSProtocolError(f"{self.where}: row {i} reply {reply!r} does not fit "
                                       f"{self.ports}x{self.channels}")
            out.append(row)
        return out

    def errors(self) -> list[tuple[int, str]]:
        """Drain the instrument's error queue."""
        out = []
        for _ in range(64):
            reply = self.query("SYST:ERR?")
            code, _, text = reply.partition(",")
            if not re.fullmatch(r"-?\d{1,6}", code):
                raise WSSProtocolError(f"{self.where}: {reply!r} is no error-queue entry")
            if int(code) == 0:
                break
            out.append((int(code), text.strip('"')))
        return out


def open_wss(wid: str, port: str, timeout: float = 1.0, settle_s: float = 0.0) -> WSSDriver:
    """WSS `wid`'s driver on its serial port (its lines on the cassette, if one records;
    from it, if one plays)."""
    dev = f"wss:{wid}"
    return cassette.opened(
        dev, lambda: WSSDriver(cassette.tap_serial(dev, serial.Serial(
            port, baudrate=BAUDRATE, timeout=timeout)), timeout, settle_s=settle_s),
        lambda player: WSSDriver(player.serial(dev, port), timeout, settle_s=settle_s))
