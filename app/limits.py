"""The arbiter's fairness rules (`oddl arbiter --limits FILE`): time limits, and what each
role or user may hold, queue and ask for. Without a file, the defaults: a user may queue
100 jobs at priority 100 at most, each running an hour at most unless it asks for more (up
to a day); an operator is bound by the time limits only.

```toml
default_time_limit_s = 3600     # a job that names none
max_time_limit_s = 86400        # the most a job may ask for
[roles.user]                    # every user of the role ...
max_running_nodes = 32          # nodes its running jobs hold, together
max_queued_jobs = 20
max_priority = 100
approval = false                # true: each job waits until an operator releases it
preempt = false                 # true: its jobs stop others' (app/preempt.py)
[users.alice]                   # ... unless named: what alice's entry sets (here her
max_running_nodes = 64          # nodes), the rest her role's, else the built-in
[notices]
keep_s = 86400                  # each job's end retained on the bus this long
allow = ["https://hooks.lab.example/oddl/"]  # where a job's webhook may point (none)
[priority]                      # the queue's order: base + age + fair share
age_per_hour = 10.0             # (app/priority.py; these are the defaults)
max_age_hours = 168
share_weight = 100.0
half_life_s = 604800
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from oddl.app.priority import Weights
from oddl.controller.base.config import (
    ConfigError,
    ConfigIssue,
    ConfigModel,
    pydantic_issues,
    read_toml,
)
from pydantic import Field, ValidationError


class Rule(ConfigModel):
    """What a role's (or a user's) jobs may hold, queue and ask for; None: no bound."""

    max_running_nodes: int | None = Field(default=None, ge=1, le=65_536)
    max_queued_jobs: int | None = Field(default=None, ge=0, le=100_000)
    max_priority: int = Field(default=1000, ge=-1000, le=1000)
    # an approve gate: each job waits, held, until an operator releases it
    approval: bool = False
    # a job of this class that waits for nodes stops running jobs of classes that do not
    # preempt, and starts (app/preempt.py); they are queued again, iterations kept
    preempt: bool = False


USER = Rule(max_queued_jobs=100, max_priority=100)


class Notices(ConfigModel):
    """How the arbiter tells of jobs' ends: on the bus, and to the webhooks a submission
    names, within the addresses an operator allows (app/notices.py)."""

    keep_s: float = Field(default=86400.0, gt=0, le=366 * 86400, allow_inf_nan=False)
    # URL prefixes (scheme, host, port, path) a job's webhook may be under: none, none
    allow: list[Annotated[str, Field(pattern=r"^https?://[^\s]+$", max_length=500)]] = Field(
        default_factory=list, max_length=100)
    retries: int = Field(default=3, ge=0, le=10)  # after the first try: 1, 2, 4 ... s apart
    timeout_s: float = Field(default=5.0, gt=0, le=60, allow_inf_nan=False)  # each try's
    # a user's standing webhook: told every end of their jobs (each under `allow`)
    users: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=500)]] \
        = Field(default_factory=dict, max_length=10_000)

    def refuses(self, url: object) -> str:
        """Why `url` may not be called (a webhook under none of `allow`, or not a URL of
        http(s), or one with user info or `..`); "" if it may."""
        import httpx

        if not isinstance(url, str) or not 0 < len(url) <= 500:
            return "a URL of at most 500 characters"
        try:
            u = httpx.URL(url)
        except httpx.InvalidURL as e:
            return f"not a URL ({e})"
        if not self.allow:
            return "this arbiter calls none ([notices] allow is empty)"
        if u.scheme not in ("http", "https") or u.userinfo or ".." in u.path.split("/") or \
                not any(_under(u, httpx.URL(a)) for a in self.allow):
            return (f"{url[:100]} is not under an address this arbiter may call ([notices] "
                    f"allow: {', '.join(self.allow)})")
        return ""


def _under(u: Any, a: Any) -> bool:
    """httpx URL `u` under `a`: its scheme, host and port, and its path below a's."""
    return (u.scheme, u.host, u.port) == (a.scheme, a.host, a.port) and \
        u.path.startswith(a.path)


class Limits(ConfigModel):
    default_time_limit_s: float = Field(default=3600.0, gt=0, le=366 * 86400,
                                        allow_inf_nan=False)
    max_time_limit_s: float = Field(default=86400.0, gt=0, le=366 * 86400,
                                    allow_inf_nan=False)
    roles: dict[str, Rule] = Field(default_factory=lambda: {"user": USER, "operator": Rule()},
                                   max_length=3)
    users: dict[str, Rule] = Field(default_factory=dict, max_length=10_000)
    priority: Weights = Field(default_factory=Weights)  # the queue's order (app/priority.py)
    notices: Notices = Field(default_factory=Notices)  # each job's end, kept a while

    def rule(self, user: str, role: str) -> Rule:
        """The rule that binds a user, field by field: what their own entry sets, else what
        their role's sets, else the built-in (issue 64: a user's entry replaced the role's
        whole, so `[users.carol] approval = true` lifted carol's priority and queue caps;
        and a partial `[roles.user]` loosened the built-in ones)."""
        merged = (USER if role == "user" else Rule()).model_dump()
        for layer in (self.roles.get(role), self.users.get(user)):
            if layer is not None:
                merged |= {k: getattr(layer, k) for k in layer.model_fields_set}
        return Rule(**merged)

    def time_limit_s(self, asked: float | None) -> float:
        """A job's limit: what it asked for, else the default; ValueError past the most."""
        if asked is not None and asked > self.max_time_limit_s:
            raise ValueError(f"time limit {asked:g} s is over this arbiter's most, "
                             f"{self.max_time_limit_s:g} s (max_time_limit_s)")
        return asked if asked is not None else min(self.default_time_limit_s,
                                                   self.max_time_limit_s)


def load_limits(path: Path | None) -> Limits:
    """The rules in `path` (the defaults without one); ConfigError naming each field."""
    if path is None:
        return Limits()
    data = read_toml(path)
    try:
        limits = Limits.model_validate(data)
    except ValidationError as e:
        raise ConfigError(pydantic_issues(path, e)) from None
    bad = [r for r in limits.roles if r not in ("operator", "user", "observer")]
    if bad:
        raise ConfigError([ConfigIssue(str(path), f"roles.{r}", "not a role: operator, "
                                       "user or observer") for r in bad])
    hooks = [ConfigIssue(str(path), f"notices.users.{u}", why)
             for u, url in limits.notices.users.items() if (why := limits.notices.refuses(url))]
    if hooks:
        raise ConfigError(hooks)
    return limits
