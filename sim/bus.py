"""The in-process control bus of the sim back end: per-message latency, seeded faults."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from oddl.controller.clock import Clock
from oddl.controller.config import Faults
from oddl.controller.messages import ControlMessage

log = logging.getLogger(__name__)


class LocalBus:
    def __init__(self, clock: Clock, latency_ns: int, faults: Faults | None = None,
                 seed: int = 0, tap: Callable[[str, ControlMessage], None] | None = None) -> None:
        self.clock = clock
        self.latency_ns = latency_ns
        self.faults = faults or Faults()
        self.rng = random.Random(seed)
        self.tap = tap
        self.handlers: dict[str, Callable[[ControlMessage], None]] = {}
        self._sent = 0
        self.dropped = 0
        self.delayed = 0
        self._lossy = self.faults.drop_probability > 0 or self.faults.delay_probability > 0

    @property
    def sent(self) -> int:
        return self._sent

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None:
        self.handlers[node] = handler

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        self._sent += 1
        delay = self.latency_ns
        if self._lossy:
            f = self.faults
            if self.rng.random() < f.drop_probability:
                self.dropped += 1
                return
            if self.rng.random() < f.delay_probability:
                self.delayed += 1
                delay += int(self.rng.random() * f.max_extra_delay_ns)
        self.clock.call_later_ns(delay, self._deliver, dst, msg)

    def _deliver(self, dst: str, msg: ControlMessage) -> None:
        h = self.handlers.get(dst)
        if h is None:
            log.warning("control message for unknown node %s dropped: %r", dst, msg)
            return
        if self.tap is not None:
            self.tap(dst, msg)
        h(msg)
