"""What an HTTP request to the arbiter carries, read within bounds: its JSON body and its
query numbers. Anything else is Refused with a 4xx naming what is wrong (app/queue.py's
handlers, app/operators.py's)."""

from __future__ import annotations

import json
import math
from typing import Any

from oddl.app.submission import Refused
from starlette.requests import Request

MAX_BODY = 256 * 1024  # a submitted experiment, and anything else a client sends


async def json_body(request: Request) -> dict[str, Any]:
    """The request's body, a JSON object of at most MAX_BODY bytes (counted as it comes:
    a lying Content-Length does not get more in)."""
    try:
        length = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise Refused(400, "Content-Length: not a number") from None
    if length > MAX_BODY:
        raise Refused(413, f"a body of at most {MAX_BODY} bytes")
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise Refused(413, f"a body of at most {MAX_BODY} bytes")
    try:
        out = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise Refused(400, f"not JSON: {e}") from None
    if not isinstance(out, dict):
        raise Refused(400, "a JSON object")
    return out


def query_number(request: Request, name: str, what: str, lo: float, hi: float,
           kind: type[int] | type[float]) -> float:
    """A query parameter's number, `lo` by default; Refused 422 naming it when it is not
    one, or not finite, or out of [lo, hi] (issue 64: 2**63 and nan answered 500)."""
    raw = request.query_params.get(name)
    if raw is None:
        return lo
    try:
        v = kind(raw)
    except ValueError:
        raise Refused(422, f"{name}: {what}, not {raw[:40]!r}") from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise Refused(422, f"{name}: {what} from {lo:g} to {hi:g}, not {raw[:40]!r}")
    return v
