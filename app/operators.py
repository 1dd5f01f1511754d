"""The operator's requests to the arbiter (`app.queue`): tokens rotated or revoked, nodes
drained and resumed, maintenance windows, users added and removed. Each is the operator's
alone, takes effect at once, and is kept in the ledger across restarts."""

from __future__ import annotations

import logging
import math
import re
import time
from pathlib import Path
from typing import Any, Protocol, cast

from oddl.app.arbiter_view import Kept, Parties, Watched
from oddl.app.requests import json_body
from oddl.app.submission import Refused
from oddl.app.users import ROLES, Role, User, new_token
from oddl.controller.base.config import Testbed
from oddl.controller.base.topology import Grid
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class Operated(Kept, Parties, Watched, Protocol):
    """What this module uses of the arbiter's service (app/arbiter_view.py)."""

    tb: Testbed
    grid: Grid
    roles: dict[str, Role]
    users: dict[str, User]
    state: Path
    windows: list[dict[str, Any]]

    def nodes(self) -> dict[str, dict[str, str]]: ...

    def time_window(self, w: dict[str, Any]) -> None: ...


log = logging.getLogger("oddl.app.queue")  # the arbiter's one log
MAX_WINDOWS = 100  # maintenance windows now and to come
MAX_UNIX_TIME = 32503680000.0  # the year 3000


async def token(svc: Operated, request: Request) -> Response:
    """An operator rotates (POST) or revokes (DELETE) a user's token, at once: the old
    one is refused from the next request; the new one is in the user's token file."""
    op = svc.who(request, "operator")
    name = request.path_params["user"]
    role = svc.roles.get(name)
    if role is None:
        raise Refused(404, f"no user {name}")
    f = svc.state / "tokens" / name
    for t in [t for t, u in svc.users.items() if u.name == name]:
        del svc.users[t]
    mark = f.with_name(f.name + ".revoked")
    if request.method == "DELETE":
        mark.touch(mode=0o600)  # first: a crash between the two leaves it revoked
        f.unlink(missing_ok=True)
        log.warning("arbiter: %s revoked %s's token", op.name, name)
        return JSONResponse({"user": name, "revoked": True})
    svc.users[new_token(f)] = User(name, role)
    mark.unlink(missing_ok=True)
    log.warning("arbiter: %s rotated %s's token (%s)", op.name, name, f)
    return JSONResponse({"user": name, "token_file": str(f)})

async def drain(svc: Operated, request: Request) -> Response:
    """An operator drains a node (no job is placed on it; a job on it runs on to its
    end) or resumes it (also a node a device would not clear)."""
    op = svc.who(request, "operator")
    node = request.path_params["node"]
    if node not in svc.grid.at.values():
        raise Refused(404, f"no node {node} in {svc.tb.name}")
    if request.url.path.endswith("/drain"):
        why = (await json_body(request)).get("reason")
        if not isinstance(why, str) or not 0 < len(why) <= 200:
            raise Refused(422, '{"reason": why, 1 to 200 characters}')
        svc.ledger.orders.drain(node, why, op.name)
        svc.adm.closed[node] = f"drained by {op.name}: {why}"
        log.warning("arbiter: %s drained %s: %s", op.name, node, why)
    else:
        svc.ledger.orders.drain(node, None)
        svc.adm.closed.pop(node, None)
        log.warning("arbiter: %s resumed %s", op.name, node)
        svc.adm.look()
    svc.tell()
    return JSONResponse({"node": node} | svc.nodes()[node])

async def maintain(svc: Operated, request: Request) -> Response:
    """An operator reserves nodes for maintenance over a window (Unix times), or for a
    user's or a role's jobs (`for`), or takes a window back (DELETE): no job (but the
    holder's) is placed on them that would run into it."""
    op = svc.who(request, "operator")
    if request.method == "DELETE":
        text = request.path_params["window"]
        if not re.fullmatch(r"[0-9]{1,18}", text):  # (an id SQLite's integers hold)
            raise Refused(422, "a window's id is a number of at most 18 digits")
        window = int(text)
        if not svc.ledger.orders.unmaintain(window):
            raise Refused(404, f"no maintenance window {window}")
        svc.windows = [w for w in svc.windows if w["id"] != window]
        log.warning("arbiter: %s took back maintenance window %d", op.name, window)
        svc.adm.look()
        svc.tell()
        return JSONResponse({"window": window, "removed": True})
    b = await json_body(request)
    nodes, start, end, why = b.get("nodes"), b.get("start"), b.get("end"), b.get("reason")
    holder = b.get("for", "")
    kind, _, name = holder.partition(":") if isinstance(holder, str) else ("", "", "")
    if holder != "" and not ((kind == "user" and name in svc.roles)
                             or (kind == "role" and name in ROLES)):
        raise Refused(422, f'for: "user:NAME" (a user of this arbiter) or "role:ROLE" '
                           f'({", ".join(ROLES)}), or none (maintenance)')
    known = set(svc.grid.at.values())
    if not (isinstance(nodes, list) and 0 < len(nodes) <= len(known)
            and all(isinstance(n, str) and n in known for n in nodes)
            and all(isinstance(t, int | float) and not isinstance(t, bool)
                    and math.isfinite(t) and 0 <= t <= MAX_UNIX_TIME for t in (start, end))
            and isinstance(why, str) and 0 < len(why) <= 200):
        raise Refused(422, '{"nodes": [nodes of this testbed], "start": Unix time, "end": '
                           'Unix time, "reason": 1 to 200 characters}')
    assert isinstance(start, int | float) and isinstance(end, int | float)  # (checked)
    if not start < end <= start + 366 * 86400 or end <= time.time():
        raise Refused(422, "end: after start, within a year of it, and not past")
    if len(svc.windows) >= MAX_WINDOWS:
        raise Refused(429, f"{MAX_WINDOWS} maintenance windows already")
    on = sorted(set(nodes))
    w: dict[str, Any] = {"id": svc.ledger.orders.maintain(on, start, end, why, op.name, holder),
                         "nodes": on, "start": start, "end": end, "why": why,
                         "by": op.name, "for": holder}
    svc.windows.append(w)
    svc.time_window(w)
    log.warning("arbiter: %s reserved %s for %s (%s)", op.name, ", ".join(w["nodes"]),
                holder or "maintenance", why)
    svc.adm.look()
    svc.tell()
    return JSONResponse(w, status_code=201)

async def user(svc: Operated, request: Request) -> Response:
    """An operator adds a user with a role (their token in STATE/tokens/NAME) or removes
    one (their token goes; their jobs stay), at run time, kept across restarts."""
    op = svc.who(request, "operator")
    name = request.path_params["user"]
    if not name.isidentifier() or len(name) > 64:
        raise Refused(422, "a user name is letters, digits and _ (64 at most)")
    for t in [t for t, u in svc.users.items() if u.name == name]:
        del svc.users[t]
    f = svc.state / "tokens" / name
    if request.method == "DELETE":
        if name not in svc.roles:
            raise Refused(404, f"no user {name}")
        f.unlink(missing_ok=True)
        del svc.roles[name]
        svc.ledger.orders.user(name, "removed", op.name)  # (a start's --user does not undo it)
        log.warning("arbiter: %s removed user %s", op.name, name)
        return JSONResponse({"user": name, "removed": True})
    role = (await json_body(request)).get("role", "user")
    if role not in ROLES:
        raise Refused(422, f'{{"role": one of {", ".join(ROLES)}}}')
    svc.roles[name] = cast(Role, role)
    svc.ledger.orders.user(name, role, op.name)
    svc.users[new_token(f)] = User(name, cast(Role, role))
    f.with_name(f.name + ".revoked").unlink(missing_ok=True)
    log.warning("arbiter: %s added user %s (%s)", op.name, name, role)
    return JSONResponse({"user": name, "role": role, "token_file": str(f)})
