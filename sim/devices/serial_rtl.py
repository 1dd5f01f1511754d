"""The ECP5 build of the O-NIC (`serial_onic`, fpga/gateware/serial_top.py), Verilated,
behind a pseudo-terminal: what a host opens with pyserial is the design's UART, bit by
bit, serial bridge included (issue 84). Nothing of oddl's model stands between the driver
and the design: the pump only turns the pty's bytes into the levels of the design's
`uart_rx` pin, `clks_per_bit` clocks a bit, and samples its `uart_tx` pin back into bytes.

The design's clock runs while a request is on its way in and its answer on its way out
(and `QUIET_BITS` bit times after), as a board's does while the host talks to it; between
requests it stands, as an idle board's work does (its time base then stops too).

A line can be made noisy, as a bad cable is: the next requests or answers garbled (a
bit flipped) or cut short (`noise`), for the tests of what the driver does with them.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import tty
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from oddl.fpga import serial_frames as S

QUIET_BITS = 24  # bit times with nothing on either line: the exchange is over
SIM_CLKS_PER_BIT = 4  # the design's UART in the co-simulation: 4 clocks a bit
SIM_NS_PER_CLK = 20  # its time base: a 50 MHz fabric


@dataclass
class Noise:
    """What the line does to the next few frames: each count is spent one frame at a time."""

    garble_requests: int = 0  # a bit of the request flipped on its way to the board
    garble_answers: int = 0  # a bit of the answer flipped on its way to the host
    cut_answers: int = 0  # the answer's second half lost
    done: dict[str, int] = field(default_factory=lambda: {"garbled": 0, "cut": 0})


def serial_onic() -> Any:
    """The design as the co-simulation builds it: its UART at SIM_CLKS_PER_BIT, its
    straps ports (one build for every node)."""
    from oddl.controller.stage2.wire import FRAME
    from oddl.fpga.gateware.serial_top import SerialONic

    return SerialONic(FRAME, SIM_CLKS_PER_BIT, SIM_NS_PER_CLK, strap_ports=True)


class PtyBoard:
    """One Verilated `serial_onic` behind a pty (`path`), pumped by a thread of its own."""

    def __init__(self, model: Any, clks_per_bit: int = SIM_CLKS_PER_BIT,
                 straps: dict[str, int] | None = None) -> None:
        self.model, self.clks = model, clks_per_bit
        self.master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.path = os.ttyname(self._slave)
        self.noise = Noise()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pty-board {self.path}",
                                        daemon=True)
        model.set("uart_rx", 1)
        for k, v in (straps or {}).items():
            model.set(k, v)
        model.reset()
        model.tick(8)

    def start(self) -> PtyBoard:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for fd in (self.master, self._slave):
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- the pump ----------------------------------------------------------------------
    def _run(self) -> None:
        pending: deque[int] = deque()
        while not self._stop.is_set():
            got = self._read(0.05 if not pending else 0)
            if got:
                pending.extend(self._line_in(got))
            if pending:
                self._send(pending)
                self._answer()

    def _read(self, timeout: float) -> bytes:
        try:
            ready, _, _ = select.select([self.master], [], [], timeout)
            return os.read(self.master, 4096) if ready else b""
        except OSError:  # no one has the pty open
            return b""

    def _line_in(self, data: bytes) -> bytes:
        if self.noise.garble_requests and S.REQ_SYNC in data:
            self.noise.garble_requests -= 1
            self.noise.done["garbled"] += 1
            b = bytearray(data)
            b[min(len(b) - 1, data.index(S.REQ_SYNC) + 5)] ^= 0x04
            return bytes(b)
        return data

    def _send(self, pending: deque[int]) -> None:
        m = self.model
        while pending:
            byte = pending.popleft()
            for bit in (0, *((byte >> i) & 1 for i in range(8)), 1):
                m.set("uart_rx", bit)
                m.tick(self.clks)

    def _answer(self) -> None:
        """The design's answer, sampled off its tx pin mid-bit, to the host."""
        m = self.model
        out = bytearray()
        idle = 0
        while idle < QUIET_BITS * self.clks:
            if m.get("uart_tx"):
                m.tick()
                idle += 1
                continue
            m.tick(self.clks // 2)  # to the start bit's middle
            byte = 0
            for i in range(8):
                m.tick(self.clks)
                byte |= m.get("uart_tx") << i
            m.tick(self.clks)  # the stop bit
            out.append(byte)
            idle = 0
        if out:
            self._line_out(bytes(out))

    def _line_out(self, data: bytes) -> None:
        n = self.noise
        if n.cut_answers:
            n.cut_answers -= 1
            n.done["cut"] += 1
            data = data[: len(data) // 2]
        elif n.garble_answers:
            n.garble_answers -= 1
            n.done["garbled"] += 1
            b = bytearray(data)
            b[min(len(b) - 1, 4)] ^= 0x01
            data = bytes(b)
        with contextlib.suppress(OSError):
            os.write(self.master, data)


def start(nodes: int = 1, channels: int = 8) -> list[PtyBoard]:
    """`nodes` boards, node i's `serial_onic` Verilated (built once a machine, cached; its
    Verilog written once here) behind a pty of its own, pumped."""
    from oddl.fpga.gateware.verilated import Model, build

    design = serial_onic()
    lib = build(design, "serial_onic")
    return [PtyBoard(Model(lib, design), straps={"node_id": i, "n_nodes": nodes,
                                                  "n_channels": channels}).start()
            for i in range(nodes)]
