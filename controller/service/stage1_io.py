"""Stage 1's device I/O for an orchestration (controller/service/admission.py), and the
watch that must keep out of its way.

The WSS tables and the boards' routes are written off the loop where the back end has
devices (its `off_loop`); while any stage 1 is under way the watch polls no WSS (its
table changes under it), and once none is it polls the tables in use again. A job's
stage 1 is undone round what is known to be out, and a device that does not answer is
the watch's to hear of (dead), never the job's failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oddl.controller.base.clock import Clock
from oddl.controller.service.backend import Backend
from oddl.controller.service.health import Health, Watch
from oddl.controller.service.stages import Stage1
from oddl.controller.stage1.arbiter import DeviceFailed


class Stage1Io:
    """The stage 1s under way (`busy`) and the watch (started with the first job)."""

    def __init__(self, backend: Backend, stage1: Stage1, health: Health, clock: Clock
                 ) -> None:
        self.b, self.stage1, self.health, self.clock = backend, stage1, health, clock
        self.busy = 0
        self.watch: Watch | None = None

    def start_watch(self) -> None:
        """WSSs polled, beats judged, from the first job on (a model's health: never)."""
        if self.watch is None and self.health.watched:
            self.watch = Watch(self.clock, self.health, self.b.wss).start()

    def stop_watch(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def run(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """`work` (a stage 1's device I/O) off the loop, then `then(what it gave)`."""
        self.busy += 1
        if self.watch is not None:
            self.watch.expected = {}

        def done(got: Any) -> None:
            self.busy -= 1
            if not self.busy and self.watch is not None:  # the tables in use, polled
                self.watch.expected = self.stage1.tables()
            then(got)

        self.b.off_loop(work, done)

    def release(self, job: str, then: Callable[[BaseException | None], None]) -> None:
        """A job's stage 1 undone, round what is known to be out. `then`: None, or what a
        device's refusal raised."""
        avoid = self.health.avoid()

        def released(got: list[DeviceFailed] | BaseException) -> None:
            if isinstance(got, BaseException):
                then(got)
                return
            for e in got:
                self.tell(e, "release")
            then(None)

        self.run(lambda: self.stage1.release(job, avoid), released)

    def tell(self, e: DeviceFailed, when: str) -> None:
        """A device did not answer stage 1 (`when`: the apply, the release): dead."""
        now = self.clock.now_ns()
        if e.what == "WSS":
            self.health.wss_answer(e.target, now, f"no answer to the {when}: {e}")
        else:
            self.health.will(e.target, now)
