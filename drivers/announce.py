"""`oddl run --publish`: a sim run's notes for the testbed's watchers, on the real bus.

A sim run's loop keeps virtual time, which jumps ahead whenever nothing is due: it can do
no network I/O. Its notes go to a thread with a loop of its own and one connection as the
controller (`oddl-ctl`); the run never waits for the broker. Notes queue up to a bound and
beyond it are dropped and counted (a watcher sees fewer iterations, the run is not
slowed). emu and hw runs need none of this: they tell the watchers on the connection they
run the job on (drivers/lab.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from oddl.controller.base.access import CONTROLLER
from oddl.controller.base.config import Testbed
from oddl.controller.base.telemetry import note_topic
from oddl.drivers.mqtt import BusError, bus_from_config

log = logging.getLogger(__name__)
MAX_QUEUED = 4096


class BusAnnouncer:
    def __init__(self, tb: Testbed) -> None:
        self.tb = tb.name
        self.dropped = 0
        self.error: BaseException | None = None
        self._bus = bus_from_config(tb.name, tb.broker, CONTROLLER)
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[tuple[str, bytes, bool] | None] = asyncio.Queue(MAX_QUEUED)
        self._up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oddl-announce", daemon=True)
        self._thread.start()
        self._up.wait(15)
        if self.error is not None:
            raise BusError(f"--publish: {self.error}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        try:
            await self._bus.start()
        except Exception as e:  # the caller raises it, naming the broker
            self.error = e
            self._up.set()
            return
        self._up.set()
        try:
            while (item := await self._queue.get()) is not None:
                topic, payload, retain = item
                with contextlib.suppress(BusError):
                    await self._bus.publish(topic, payload, qos=0, retain=retain)
        finally:
            await self._bus.close()

    def announce(self, kind: str, payload: bytes) -> None:
        topic, retain = note_topic(self.tb, kind)
        self._loop.call_soon_threadsafe(self._put, (topic, payload, retain))

    def _put(self, item: tuple[str, bytes, bool] | None) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1
            if item is None:  # closing: make room for the end
                self._queue.get_nowait()
                self._queue.put_nowait(None)

    def close(self) -> None:
        """Send what is queued, then disconnect (15 s at most)."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended (no broker)
            self._loop.call_soon_threadsafe(self._put, None)
        self._thread.join(15)
        if self.dropped:
            log.warning("--publish: %d notes dropped (the broker was slower than the run)",
                        self.dropped)
