"""When a run's drill faults begin (the experiment's `[[faults]]`), kept once for every back
end: each timed one at its `start_ms` from the first job's start, each other one at the
start of its `at_iteration`. The back end injects (sim: into its models; emu: through the
emulator's control endpoint); a lab has no drill."""

from __future__ import annotations

from collections.abc import Callable

from oddl.controller.base.clock import Clock
from oddl.controller.base.config import FaultSpec


class DrillPlan:
    def __init__(self, faults: list[FaultSpec], clock: Clock,
                 inject: Callable[[FaultSpec], None]) -> None:
        self.faults, self.clock, self.inject = list(faults), clock, inject
        self._armed = False
        self._begun: set[int] = set()  # id() of the faults already begun

    def arm(self) -> None:
        """Timed faults count from now (the first job's start); called again: nothing."""
        if self._armed:
            return
        self._armed = True
        t0 = self.clock.now_ns()
        for f in self.faults:
            if f.at_iteration is None:
                self.clock.call_at_ns(t0 + round(f.start_ms * 1e6), self._begin, f)

    def to_come(self) -> bool:
        """A fault has not begun yet (a run's iterations are not yet all alike)."""
        return len(self._begun) < len(self.faults)

    def at_iteration(self, i: int) -> None:
        """Iteration `i` begins: the faults due at it begin (once, whatever the attempt)."""
        for f in self.faults:
            if f.at_iteration == i and id(f) not in self._begun:
                self._begin(f)

    def _begin(self, f: FaultSpec) -> None:
        self._begun.add(id(f))
        self.inject(f)
