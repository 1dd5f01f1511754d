"""A drill on the emulated testbed: an experiment's `[[faults]]` injected into a running
`oddl emulate` when each is due, through its control endpoint (sim/devices/control.py).

A drill lasts as long as its run: faults with no `duration_ms` end when the run does.
`at_ms` counts from the first job's start; `at_iteration` is when that iteration begins
(here: when the one before it is recorded, so the nodes may be a few milliseconds into
it). The emulator is on this host (its endpoint listens on loopback only), so its times
and the controller's read the same monotonic clock. A lab's own testbed has no endpoint:
its faults are real, and a drill there is refused.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path
from typing import Any

import httpx
from oddl.controller.base.clock import Clock
from oddl.controller.base.config import Emulator, FaultSpec
from oddl.controller.service.backend import Injected, RunFailed
from oddl.controller.service.drill import DrillPlan
from oddl.drivers import cassette

log = logging.getLogger(__name__)
TIMEOUT_S = 5.0


def read_token(path: str) -> str:
    p = Path(path)
    try:
        if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RunFailed(f"emulator token file {p} is readable by others: chmod 600 it")
        return p.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise RunFailed(f"emulator token file: {e}") from None


class RemoteDrill:
    def __init__(self, emulator: Emulator | None, faults: list[FaultSpec],
                 clock: Clock) -> None:
        self.faults, self.clock = list(faults), clock
        self.injected: list[Injected] = []
        self.error: str | None = None  # the emulator refused a fault: the run stops
        self._index: dict[int, int] = {}  # id(row) -> the emulator's index
        self._tasks: set[asyncio.Future[Any]] = set()
        self.plan = DrillPlan(self.faults, clock, self._go)
        self.client: httpx.AsyncClient | None = None
        if not self.faults:
            return
        if emulator is None:
            raise RunFailed("[[faults]]: a drill needs an emulated testbed (`oddl emulate` "
                            "writes its control endpoint into the config's [emulator]); a "
                            "lab's faults are its own")
        played = isinstance(cassette.active, cassette.Player)  # no emulator, no token
        self.client = httpx.AsyncClient(
            base_url=emulator.control, timeout=TIMEOUT_S,
            transport=cassette.http_transport("emulator"),
            headers={} if played else
            {"authorization": f"Bearer {read_token(emulator.token_file)}"})

    def arm(self) -> None:
        """Timed faults count from now (the first job's start)."""
        if self.client is not None:
            self.plan.arm()

    def at_iteration(self, i: int) -> None:
        self.plan.at_iteration(i)

    def _go(self, f: FaultSpec) -> None:
        x = Injected(f, self.clock.now_ns())  # when it was due; the answer corrects it
        self.injected.append(x)
        fut = asyncio.ensure_future(self._inject(x))
        self._tasks.add(fut)
        fut.add_done_callback(self._tasks.discard)

    async def _inject(self, x: Injected) -> None:
        assert self.client is not None
        try:
            r = await self.client.post("/faults", content=x.spec.model_dump_json())
        except httpx.HTTPError as e:
            self.error = f"the emulator's control endpoint: {e!r}"
            return
        if r.status_code != 201:
            self.error = f"the emulator refused {x.spec}: {r.text[:500]}"
            return
        row = r.json()
        x.at_ns = cassette.host_ns(int(row["at_ns"]))  # the emulator's clock: this host's
        self._index[id(x)] = int(row["index"])
        log.warning("drill: %s injected into the emulator", x.spec)

    async def finish(self) -> None:
        """The run ends, and its drill with it: faults still in force are ended (the
        emulator serves the next run whole); each row gets its end and retries as the
        emulator saw them."""
        if self.client is None:
            return
        late = [x for x in self.injected if id(x) not in self._index]
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for x in late:  # still on its way when the jobs ended (a loaded host)
            if id(x) in self._index:
                log.warning("drill: %s reached the emulator only after the run's jobs "
                            "had ended: it disturbed nothing", x.spec)
        try:
            for x in self.injected:
                i = self._index.get(id(x), -1)
                if i >= 0 and x.until_ns is None:
                    await self.client.delete(f"/faults/{i}")
            rows = (await self.client.get("/faults")).json() if self._index else []
            for x in self.injected:
                i = self._index.get(id(x), -1)
                if 0 <= i < len(rows):
                    until = rows[i]["until_ns"]
                    x.until_ns = None if until is None else int(until)
                    x.retries = int(rows[i]["retries"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            log.warning("drill: the emulator's fault rows: %r", e)
        finally:
            await self.client.aclose()
