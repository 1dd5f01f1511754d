"""The emulator's control endpoint: a drill's faults injected while a job runs.

`oddl emulate` serves it on 127.0.0.1 (never elsewhere) with a bearer token of the run's
own, written beside the other secrets and named in the emu config's `[emulator]`. A run
whose experiment has `[[faults]]` posts each one when it is due; an operator can do the
same by hand (docs/faults.md):

    GET    /faults        every fault injected so far, with when it began and ended
    POST   /faults        a FaultSpec as JSON: injected at once (its duration_ms counts
                          from now); the answer is its row
    DELETE /faults/{i}    fault i is over now

Bodies are bounded and checked as a config's `[[faults]]` entry is: a bad one gets 422
with the field and the reason, and nothing is injected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oddl.controller.base.config import FaultSpec, Testbed, fault_issues
from oddl.controller.serving import http
from oddl.sim.devices.faults import Drill, Injected
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MAX_BODY = 16 << 10  # one FaultSpec is a few hundred bytes
MAX_FAULTS = 1024  # a drill's faults held by one emulator


def row(i: int, x: Injected) -> dict[str, Any]:
    """Times on this host's monotonic clock, in ns (what a controller here reads too)."""
    return {"index": i, "spec": x.spec.model_dump(mode="json", exclude_none=True),
            "at_ns": x.at_ns, "until_ns": x.until_ns, "retries": x.retries}


class ControlEndpoint:
    """One uvicorn server on the emulator's loop, started and stopped with it."""

    def __init__(self, tb: Testbed, drill: Drill, token: str,
                 refuse: Callable[[FaultSpec], str | None] = lambda f: None,
                 port: int = 0) -> None:
        """refuse: why this emulator cannot inject `f` (None: it can)."""
        self.tb, self.drill, self.refuse = tb, drill, refuse
        self.app = Starlette(routes=[
            Route("/faults", self._list, methods=["GET"]),
            Route("/faults", self._inject, methods=["POST"]),
            Route("/faults/{i:int}", self._revert, methods=["DELETE"]),
        ], middleware=[Middleware(http.BearerToken, tokens={token: "operator"},
                                  hint="the emu config's [emulator] token_file")])
        self.http = http.HttpService(self.app, "127.0.0.1", port)

    @property
    def url(self) -> str:
        return self.http.url

    async def start(self) -> ControlEndpoint:
        await self.http.start()
        return self

    async def stop(self) -> None:
        await self.http.stop()

    async def _list(self, request: Request) -> Response:
        return JSONResponse([row(i, x) for i, x in enumerate(self.drill.injected)])

    async def _inject(self, request: Request) -> Response:
        if int(request.headers.get("content-length") or MAX_BODY + 1) > MAX_BODY:
            return JSONResponse({"error": f"a fault is at most {MAX_BODY} bytes, with "
                                          f"Content-Length"}, 413)
        body = await request.body()
        try:
            f = FaultSpec.model_validate_json(body[:MAX_BODY])
        except ValidationError as e:
            errs = [f"{'.'.join(map(str, x['loc'])) or 'fault'}: {x['msg']}" for x in e.errors()]
            return JSONResponse({"error": "; ".join(errs)}, 422)
        why = "; ".join(f"{p}: {r}" for p, r in fault_issues([f], self.tb)) or self.refuse(f)
        if why:
            return JSONResponse({"error": why}, 422)
        if len(self.drill.injected) >= MAX_FAULTS:
            return JSONResponse({"error": f"this emulator holds {MAX_FAULTS} faults at "
                                          f"most: restart it"}, 429)
        self.drill.inject(f)
        i = len(self.drill.injected) - 1
        return JSONResponse(row(i, self.drill.injected[i]), 201)

    async def _revert(self, request: Request) -> Response:
        i = request.path_params["i"]
        if not 0 <= i < len(self.drill.injected):
            return JSONResponse({"error": f"no fault {i}"}, 404)
        x = self.drill.injected[i]
        if x.until_ns is None:
            self.drill.revert(x.spec)
        return JSONResponse(row(i, x))
