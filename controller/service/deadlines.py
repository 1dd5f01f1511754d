"""The service's time limits: a job's limit runs from its first start (a stop and a
restart do not reset it); at its end the job is cancelled, and ends "timeout"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from oddl.controller.base.clock import Clock

# end a job now, saying why (the orchestration's cancel; False: it is not there)
Cancel = Callable[[str, str], bool]


class Deadlines:
    """Each started job's end on the clock, its timer, and which jobs their limit ended."""

    def __init__(self, clock: Clock, cancel: Cancel) -> None:
        self.clock, self._cancel = clock, cancel
        self._start_ns: dict[str, int] = {}  # each started job's first start
        self._end_ns: dict[str, int] = {}
        self._timer: dict[str, asyncio.TimerHandle] = {}
        self._expired: set[str] = set()
        self._limit_ns: dict[str, int] = {}  # a limit changed before the job's first start

    def begin(self, name: str, limit_ns: int) -> None:
        """A job starts (again): its limit runs from its first start."""
        if name not in self._start_ns:
            self._start_ns[name] = self.clock.now_ns()
            self._set(name, self._limit_ns.pop(name, limit_ns))

    def change(self, name: str, limit_ns: int) -> None:
        """A job's new limit (0: none): from its first start, or once it starts. One it
        has run past already ends now."""
        if name not in self._start_ns:
            self._limit_ns[name] = limit_ns
            return
        self._end_ns.pop(name, None)
        if (timer := self._timer.pop(name, None)) is not None:
            timer.cancel()
        self._set(name, limit_ns)

    def _set(self, name: str, limit_ns: int) -> None:
        if limit_ns:
            end = self._end_ns[name] = self._start_ns[name] + limit_ns
            self._timer[name] = self.clock.call_at_ns(max(end, self.clock.now_ns()),
                                                      self._expire, name, limit_ns / 1e9)

    def end_of(self, name: str) -> int | None:
        """When a started job's limit ends (clock ns), if it has one."""
        return self._end_ns.get(name)

    def ended(self, name: str) -> bool:
        """A job has left: forgotten. Whether its limit is what ended it."""
        self._start_ns.pop(name, None)
        self._limit_ns.pop(name, None)
        self._end_ns.pop(name, None)
        if (timer := self._timer.pop(name, None)) is not None:
            timer.cancel()
        expired = name in self._expired
        self._expired.discard(name)
        return expired

    def close(self) -> None:
        for timer in self._timer.values():
            timer.cancel()

    def _expire(self, name: str, limit_s: float) -> None:
        self._timer.pop(name, None)
        self._expired.add(name)
        if not self._cancel(name, f"its time limit of {limit_s:g} s was reached"):
            self._expired.discard(name)
