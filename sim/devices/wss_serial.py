"""An emulated WSS instrument on a pseudo-terminal, speaking docs/wss-protocol.md.

The instrument runs on the pty's master end (a thread); the driver opens the slave path with
unmodified pyserial. The table logic is the WSS model's, so it refuses what the model
refuses. Faults for tests and acceptance: `mode = "garbage"` answers noise, `"noise"` sends
a line of it before each reply, `"silent"` answers nothing.
"""

from __future__ import annotations

import os
import re
import threading
import time
import tty
from collections import deque

from oddl.controller.base.devices import DeviceRefused
from oddl.sim.devices.wss import WSSModel

FIRMWARE = "fw0.1"


INPUT_BUFFER = 4096  # bytes of one command line the instrument holds
ERROR_QUEUE = 32  # entries, as a SCPI instrument keeps
LOG_LINES = 1024  # the last command lines kept for protocol tests (a flood must not grow it)
_NUMBER = re.compile(r"[0-9]{1,6}")  # a port: decimal digits only, no sign, no '_'


def _port(text: str) -> int | None:
    """A port number as the instrument's parser reads one (Python's int() would also take
    '+1', ' 1' and '1_0'); None if it is not one."""
    return int(text) if _NUMBER.fullmatch(text) else None

class SerialWSS:
    def __init__(self, model: WSSModel, reconfig_ms: float = 0.0) -> None:
        self.model = model
        self.reconfig_ms = reconfig_ms
        self.staged: list[list[int | None]] = [[None] * model.channels
                                               for _ in range(model.ports)]
        self.errors: list[tuple[int, str]] = []
        self.mode = "normal"  # "normal" | "garbage" | "noise" | "silent" | "babble"
        self.log: deque[str] = deque(maxlen=LOG_LINES)  # the last command lines received
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.path = os.ttyname(self._slave)
        self._stop = threading.Event()
        # the thread sleeps until a line comes or `close` writes here: no polling (16
        # instruments woken every 50 ms cost an idle emulator a tenth of a core)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name=f"wss-{model.id}",
                                        daemon=True)

    def start(self) -> SerialWSS:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        for fd in (self._master, self._slave, self._wake_r, self._wake_w):
            os.close(fd)

    # --- the instrument ------------------------------------------------------------------
    def _serve(self) -> None:
        import select

        buf = bytearray()
        overrun = False  # the line being received outgrew the input buffer: drop it whole
        poller = select.poll()  # select() cannot watch a descriptor numbered 1024 or more
        poller.register(self._master, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            if self._master not in {fd for fd, _ev in poller.poll()}:
                continue
            try:
                chunk = os.read(self._master, 4096)
            except OSError:
                return
            while chunk:
                nl = chunk.find(b"\n")
                part, chunk = (chunk, b"") if nl < 0 else (chunk[:nl], chunk[nl + 1:])
                if not overrun:
                    buf += part
                    if len(buf) > INPUT_BUFFER:
                        overrun = True
                        buf.clear()
                if nl < 0:
                    break
                reply = (self._err(-363, "Input buffer overrun") if overrun
                         else self.handle(bytes(buf).rstrip(b"\r")))
                overrun = False
                buf.clear()
                if self.mode == "silent" or self.model.dead:  # a dead WSS answers nothing
                    continue
                if self.mode == "babble":  # a broken device: bytes, and never an end of line
                    self._babble()
                    continue
                if self.mode == "garbage":
                    reply = "\x8f\x02#&%@\x99"
                if self.mode == "noise":  # a noisy line: junk before the reply
                    os.write(self._master, b"\x8f\x02#&%@\x99\n")
                os.write(self._master, reply.encode("latin-1") + b"\n")

    def _babble(self, seconds: float = 60.0) -> None:
        end = time.monotonic() + seconds
        while self.mode == "babble" and time.monotonic() < end and not self._stop.is_set():
            os.write(self._master, b"#" * 64)
            time.sleep(0.005)

    def _err(self, code: int, text: str) -> str:
        """Queue the error, as SCPI does: a full queue's last entry becomes -350."""
        if len(self.errors) < ERROR_QUEUE:
            self.errors.append((code, text))
        else:
            self.errors[-1] = (-350, "Queue overflow")
        return f'ERR {code},"{text}"'

    def handle(self, raw: bytes) -> str:
        try:
            line = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            return self._err(-100, "malformed line (not ASCII)")
        if len(line) > 4096:
            return self._err(-100, "malformed line (too long)")
        self.log.append(line)
        head, _, args = line.partition(" ")
        head = head.upper()
        m = self.model
        if head == "*IDN?":
            return f"ODDL,WSS,{m.id},{m.ports}x{m.channels},{FIRMWARE}"
        if head == "SYST:ERR?":
            if not self.errors:
                return '0,"No error"'
            code, text = self.errors.pop(0)
            return f'{code},"{text}"'
        if head == "ROUT:CLR":
            self.staged = [[None] * m.channels for _ in range(m.ports)]
            return "OK"
        if head == "ROUT:COPY":
            self.staged = [list(r) for r in m.table]
            return "OK"
        if head in ("ROUT:ROW", "ROUT:ROW?"):
            parts = [p.strip() for p in args.split(",")] if args.strip() else []
            if not parts:
                return self._err(-109, f"{head} needs an input port")
            i = _port(parts[0])
            if i is None:
                return self._err(-109, f"input port {parts[0]!r} is not a number")
            if not 0 <= i < m.ports:
                return self._err(-222, f"input port {i} out of range (0-{m.ports - 1})")
            if head == "ROUT:ROW?":
                if len(parts) != 1:
                    return self._err(-109, "ROUT:ROW? takes one parameter")
                return ",".join("-" if o is None else str(o) for o in m.table[i])
            outs = parts[1:]
            if len(outs) > m.channels:
                return self._err(-222, f"{len(outs)} channels given, the WSS has {m.channels}")
            row: list[int | None] = []
            for o in outs:
                if o == "-":
                    row.append(None)
                    continue
                v = _port(o)
                if v is None:
                    return self._err(-109, f"output {o!r} is not a number or '-'")
                if not 0 <= v < m.ports:
                    return self._err(-222, f"output port {v} out of range (0-{m.ports - 1})")
                row.append(v)
            self.staged[i] = row + [None] * (m.channels - len(row))
            return "OK"
        if head == "ROUT:APPL":
            try:
                m.set_table([list(r) for r in self.staged])
            except DeviceRefused as e:
                return self._err(-221, str(e).replace('"', "'"))
            if self.reconfig_ms:
                time.sleep(self.reconfig_ms / 1000)  # the LCoS settles before OK
            return "OK"
        return self._err(-113, f"unknown command {head!r}")
