"""A board's interrupt line for the node program beside it (`controller.devices.
InterruptLine`), two ways a lab has it.

- `PynqLine`: on the board's own processor, pynq's `Interrupt` on the overlay's
  interrupt pin; a task awaits it and hands each interrupt to the handler.
- `PolledLine`: from the node's host over PYNQ.remote, which carries no interrupts: a
  thread reads IRQ_STATUS and wakes the loop when an enabled event is pending, then waits
  for the handler (which reads and clears the register) before it polls again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from oddl.fpga import regmap as R

POLL_S = 0.0005  # between polls of an idle board: each poll is a register read


class PolledLine:
    def __init__(self, mmio: Any, name: str = "", poll_s: float = POLL_S) -> None:
        self.mmio = mmio
        self.name = name
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def connect(self, handler: Callable[[], None]) -> None:
        self.disconnect()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, daemon=True,
                                        args=(handler, asyncio.get_running_loop()),
                                        name=f"irq-{self.name}")
        self._thread.start()

    def disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self._thread = None

    def _poll(self, handler: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        off = R.BY_NAME["IRQ_STATUS"].offset
        handled = threading.Event()

        def deliver() -> None:
            try:
                handler()
            finally:
                handled.set()

        while not self._stop.is_set():
            try:
                pending = self.mmio.read(off)
            except Exception:  # the board went away: the control units' time-outs say so
                return
            if pending:
                handled.clear()
                try:
                    loop.call_soon_threadsafe(deliver)
                except RuntimeError:  # the loop has closed
                    return
                handled.wait(1.0)
            else:
                self._stop.wait(self.poll_s)


class PynqLine:
    """pynq's `Interrupt` (needs the board's overlay loaded, so only on the board)."""

    def __init__(self, pin: str) -> None:
        self.pin = pin
        self._task: asyncio.Task[None] | None = None

    def connect(self, handler: Callable[[], None]) -> None:
        from pynq import Interrupt

        irq = Interrupt(self.pin)

        async def wait() -> None:
            while True:
                await irq.wait()
                handler()

        self.disconnect()
        self._task = asyncio.get_running_loop().create_task(wait())

    def disconnect(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
