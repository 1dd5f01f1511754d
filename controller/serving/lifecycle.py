"""How every oddl command and service starts and stops.

One rule for all of them (ARTIQ's master is the model): each service is registered for its
stop the moment it has started, and a stop, whatever asked for it, closes them in the
reverse order. SIGINT (a terminal's Ctrl-C, sent to the whole process group) and SIGTERM
(systemd, `kill`) stop a command the same way: its `finally` blocks and context managers
run, it says in one line what it stopped and where its partial results are, and it exits
130 or 143 (128 + the signal), never with a traceback. A second signal while stopping
ends the process at once.

- A command that computes (a virtual-time run never waits on I/O, so no event loop would
  notice a signal) has the signal raised in it as `Stopped`, a KeyboardInterrupt: whatever
  unwinds for Ctrl-C unwinds for SIGTERM too.
- A service on an event loop (arbiter, dashboard, emulator, node program) runs in
  `Services`: the signal sets its stop, the services close in reverse order, then
  `Stopped` is raised to the command line with what was stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_EACH_S = 20.0  # a service that has not stopped in this long is left behind, and named


class Stopped(KeyboardInterrupt):
    """The command was asked to stop by `signum`. `notes`: what it stopped and where its
    partial results are, said in the command's last line."""

    def __init__(self, signum: int = signal.SIGINT, *notes: str) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.notes = list(notes)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        return f"stopped ({signal.Signals(self.signum).name})" + (
            f": {'; '.join(self.notes)}" if self.notes else "")


stopped_by: int | None = None  # the signal that asked this process to stop, once one did


def _raise(signum: int, _frame: FrameType | None) -> None:
    global stopped_by
    stopped_by = signum  # (a library that takes the stop for its own, as pytest, hides it)
    # from here on, a second signal is a user who will not wait for the stop
    for s in SIGNALS:
        signal.signal(s, _force)
    raise Stopped(signum)


def _force(signum: int, _frame: FrameType | None) -> None:
    sys.stderr.write(f"\n{signal.Signals(signum).name} again: stopped at once, without "
                     f"closing\n")
    sys.stderr.flush()
    os._exit(128 + signum)


_deaf = False  # a worker process its parent stops (`deaf`)


def deaf() -> None:
    """This process is a worker whose parent stops it: SIGINT and SIGTERM, which a
    terminal or a supervisor sends the whole process group, are ignored, and nothing here
    installs a handler for them (the parent hears them, and stops its workers itself)."""
    global _deaf
    _deaf = True
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def _handles_signals() -> bool:
    return not _deaf and threading.current_thread() is threading.main_thread()


def raise_on_signals() -> None:
    """SIGINT and SIGTERM raise `Stopped` in the main thread, also where the process was
    started with them ignored (a shell's background job), but not in a `deaf` worker."""
    if _handles_signals():
        for s in SIGNALS:
            signal.signal(s, _raise)


@contextlib.contextmanager
def sigint_ignored(*signums: int) -> Iterator[None]:
    """SIGINT (or `signums`) ignored while a child process is started: it inherits the
    disposition across exec, so a terminal's Ctrl-C (sent to the whole group) leaves it to
    its parent, which stops it itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in signums or (signal.SIGINT,)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def as_stopped(e: BaseException) -> Stopped:
    """A KeyboardInterrupt that is not ours (Python's own Ctrl-C) as a SIGINT stop."""
    return e if isinstance(e, Stopped) else Stopped(signal.SIGINT)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close an event loop that a stop may have left mid-run: its tasks are cancelled and
    let finish first (none is destroyed pending), then its async generators."""
    if loop.is_closed():
        return
    # a task the stop's signal interrupted ended with it, and nobody reads it: not worth
    # a traceback when it is collected ("Task exception was never retrieved")
    loop.set_exception_handler(_quiet_stops)
    if not loop.is_running():
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def _quiet_stops(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if not isinstance(context.get("exception"), Stopped):
        loop.default_exception_handler(context)


class Services:
    """Services on one event loop, each registered for its stop as it starts, stopped in
    the reverse order on the way out of `async with`: when `run` returns (a service ended
    on its own, or `stop()`), when a signal comes (also part-way through the starts; then
    `Stopped` is raised, naming what was stopped), or when something raised."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._stops: list[tuple[str, Callable[[], Any]]] = []
        self._signal: int | None = None
        self._stop = asyncio.Event()
        self._main: asyncio.Task[Any] | None = None
        self._running = False

    async def __aenter__(self) -> Services:
        self._main = asyncio.current_task()
        if _handles_signals():
            loop = asyncio.get_running_loop()
            for s in SIGNALS:
                loop.add_signal_handler(s, self._signalled, s)
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        _tb: object) -> None:
        try:
            stopped = await self.aclose()
        finally:
            if _handles_signals():
                loop = asyncio.get_running_loop()
                for s in SIGNALS:
                    loop.remove_signal_handler(s)
                raise_on_signals()
        if self._signal is not None and (et is None or issubclass(et, asyncio.CancelledError)):
            raise Stopped(self._signal, f"{self.what}: {', '.join(stopped) or 'nothing'} "
                                        f"stopped")

    async def start(self, name: str, started: Awaitable[T], stop: Callable[[], Any]) -> T:
        """Await `started`; from then on `stop()` (a function or a coroutine function) is
        called once on the way out."""
        out = await started
        self._stops.append((name, stop))
        return out

    def add(self, name: str, stop: Callable[[], Any]) -> None:
        """Something already started, to stop on the way out."""
        self._stops.append((name, stop))

    def stop(self) -> None:
        """Ask for the stop (as a signal does, but for the exit status)."""
        self._stop.set()

    @property
    def signalled(self) -> int | None:
        return self._signal

    async def run(self, *serving: Awaitable[Any]) -> None:
        """Serve until a signal, `stop()`, or one of `serving` ends (its error is raised);
        the others are cancelled."""
        tasks = [asyncio.ensure_future(x) for x in serving]
        waiter = asyncio.ensure_future(self._stop.wait())
        self._running = True
        try:
            await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._running = False
            waiter.cancel()
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        ended = next((t for t in tasks if t.done() and not t.cancelled()
                      and t.exception() is not None), None)
        if ended is not None and self._signal is None:
            raise ended.exception()  # type: ignore[misc]  # not None: checked above

    def _signalled(self, signum: int) -> None:
        if self._signal is not None:
            _force(signum, None)
        self._signal = signum
        self._stop.set()
        if not self._running and self._main is not None:
            self._main.cancel()  # still starting: the start is given up

    async def aclose(self) -> list[str]:
        """Stop every service in the reverse order of their starts (each given
        `STOP_EACH_S`; a failure is logged and the others still stopped); returns their
        names in the order stopped."""
        done = []
        while self._stops:
            name, stop = self._stops.pop()
            try:
                r = stop()
                if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
                    async with asyncio.timeout(STOP_EACH_S):
                        await r
                done.append(name)
            except TimeoutError:
                log.warning("%s: %s did not stop within %g s", self.what, name, STOP_EACH_S)
            except Exception as e:
                log.warning("%s: stopping %s failed: %s", self.what, name, e)
        return done
