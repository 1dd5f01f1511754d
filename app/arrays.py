"""Job arrays (issue 86): one submission, a sweep over seeds, as Slurm's `--array`.

`oddl submit FILE --array 0-15` (POST /jobs `"array": "0-15"`; also `0-15:4`, `1,3,9`,
and lists of those) queues one job a value N, named `ID_N` (ID the array's), each the
submitted experiment with `seed = N`: the tasks queue, run, are cancelled and report
apart (`oddl jobs`, `oddl cancel ID_N`), and as one under the array's id (`oddl job ID`,
`oddl wait ID`, `oddl cancel ID`). Every task is checked as a job before any is queued.
"""

from __future__ import annotations

import re
import tomllib
from typing import TYPE_CHECKING, Any

import tomli_w
from oddl.app.arbiter_view import Kept
from oddl.app.ledger import ACTIVE
from oddl.app.submission import Refused

if TYPE_CHECKING:
    from oddl.app.users import User

MAX_TASKS = 256  # tasks an array holds
MAX_VALUE = 999_999  # a task's value (its seed)
_RANGE = re.compile(r"^(\d{1,6})(?:-(\d{1,6})(?::(\d{1,6}))?)?$")
_USAGE = ('array: values, ranges and steps, as "0-15", "0-15:4" or "1,3,9" (0 to '
          f'{MAX_VALUE:,}, {MAX_TASKS} tasks at most)')


def tasks(spec: Any) -> list[int]:
    """The values an array's spec names, in order, once each; Refused (422) saying why
    not one."""
    if not isinstance(spec, str) or not 0 < len(spec) <= 200:
        raise Refused(422, _USAGE)
    out: list[int] = []
    for part in spec.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise Refused(422, f"{_USAGE}; not {part.strip()[:40]!r}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        step = int(m[3]) if m[3] is not None else 1
        if hi < lo or step < 1 or (hi - lo) // step + 1 + len(out) > MAX_TASKS:
            raise Refused(422, f"{_USAGE}; {part.strip()[:40]!r} is empty, steps by 0, or "
                               f"makes more than {MAX_TASKS} tasks")
        out += range(lo, hi + 1, step)
    if len(set(out)) != len(out):
        raise Refused(422, f"{_USAGE}; a value is named twice")
    return out


def task_text(text: str, value: int) -> str:
    """The submitted experiment as task `value` runs it: its `seed` the value."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise Refused(422, f"the submitted experiment: {e}") from None
    return tomli_w.dumps(data | {"seed": value})


def members(svc: Kept, array: str) -> list[dict[str, Any]]:
    """The array's tasks, in submission order (none: no such array; an id that is no
    job's, jN, is not looked for)."""
    if not re.fullmatch(r"j\d{1,12}", array):
        return []
    tail = re.compile(rf"^{re.escape(array)}_\d{{1,6}}$")
    return [j for j in svc.ledger.jobs(array=array) if tail.match(j["job"])]


def as_one(svc: Kept, array: str) -> dict[str, Any]:
    """The array as one job: its tasks, and its state: active while one is, else
    finished if all did, else the first other end of a task (404: no such array)."""
    found = members(svc, array)
    if not found:
        raise Refused(404, f"no job {array}")
    states = [j["state"] for j in found]
    state = next((s for s in ("running", "queued") if s in states), None) or (
        "finished" if set(states) == {"finished"} else
        next(s for s in states if s != "finished"))
    return {"job": array, "array": True, "user": found[0]["user"], "state": state,
            "tasks": found}


def cancel(svc: Kept, user: User, array: str) -> dict[str, Any]:
    """Every task of the array not ended, cancelled (its user's or an operator's)."""
    found = members(svc, array)
    if not found:
        raise Refused(404, f"no job {array}")
    if user.role != "operator" and found[0]["user"] != user.name:
        raise Refused(403, f"job {array} is {found[0]['user']}'s, not {user.name}'s")
    gone = [j["job"] for j in found if j["state"] in ACTIVE
            and svc.adm.cancel(j["job"], f"cancelled by {user.name} (its array {array})")]
    if not gone:
        raise Refused(409, f"job {array}: no task left to cancel")
    return {"job": array, "cancelled": True, "tasks": gone}
