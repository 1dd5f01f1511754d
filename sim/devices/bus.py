"""The in-process control bus of the sim back end: per-message latency, seeded faults.

Faults are set while it runs (sim/devices/faults.py): a burst of loss (`set_loss`), a broker that
is down (everything dropped), nodes that are dead (nothing to or from them)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import ControlMessage

log = logging.getLogger(__name__)


class LocalBus:
    def __init__(self, clock: Clock, latency_ns: int, seed: int = 0,
                 tap: Callable[[str, ControlMessage], None] | None = None) -> None:
        self.clock = clock
        self.latency_ns = latency_ns
        self.rng = random.Random(seed)
        self.tap = tap
        self.handlers: dict[str, Callable[[ControlMessage], None]] = {}
        self.sent = 0  # messages sent (the `Bus` protocol's count)
        self.dropped = 0
        self.delayed = 0
        self.drop_p = self.delay_p = 0.0
        self.max_extra_delay_ns = 0
        self._lossy = False
        self.down = False  # the broker is gone: nothing goes through
        self.dead: set[str] = set()  # boards that are gone: nothing to or from them
        self.lose: Callable[[ControlMessage], bool] | None = None  # a planted loss: the
        # messages it picks are dropped (a test's or drill's, beside the random ones)

    def set_loss(self, drop_p: float, delay_p: float = 0.0, max_extra_delay_ns: float = 0
                 ) -> None:
        self.drop_p, self.delay_p = drop_p, delay_p
        self.max_extra_delay_ns = round(max_extra_delay_ns)
        self._lossy = drop_p > 0 or delay_p > 0

    def passes(self, src: str, dst: str | None = None) -> bool:
        """Can a message from src (to dst) get through now (broker up, both alive)?"""
        return not self.down and src not in self.dead and dst not in self.dead

    def attach(self, node: str, handler: Callable[[ControlMessage], None]) -> None:
        self.handlers[node] = handler

    def send(self, src: str, dst: str, msg: ControlMessage) -> None:
        self.sent += 1
        delay = self.latency_ns
        if self._lossy or self.down or self.dead or self.lose is not None:
            # the generator is drawn only on a lossy bus: a dead board or a planted loss
            # alone leaves it as it was, so a run's iterations can still repeat
            if not self.passes(src, dst) or (self.lose is not None and self.lose(msg)) \
                    or (self._lossy and self.rng.random() < self.drop_p):
                self.dropped += 1
                return
            if self._lossy and self.rng.random() < self.delay_p:
                self.delayed += 1
                delay += int(self.rng.random() * self.max_extra_delay_ns)
        self.clock.call_later_ns(delay, self._deliver, dst, msg)

    def _deliver(self, dst: str, msg: ControlMessage) -> None:
        if dst in self.dead:
            return
        h = self.handlers.get(dst)
        if h is None:
            log.warning("control message for unknown node %s dropped: %r", dst, msg)
            return
        if self.tap is not None:
            self.tap(dst, msg)
        h(msg)
