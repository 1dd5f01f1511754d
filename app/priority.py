"""A queued job's priority now, as the arbiter orders its queue (Slurm's multifactor
priority, in small):

    priority = base + age + share
    age      = age_per_hour x min(hours queued, max_age_hours)
    share    = share_weight x 2 ** -(U / S)

`base` is the job's own (`oddl submit --priority`, an operator's `oddl priority`); U is the
user's fraction of every user's usage, node-seconds held with each second worth half as
much `half_life_s` later (`Ledger.decayed`); S is their fraction of the shares, 1 / (users
with usage, or 1): a user who held nothing gets the whole `share_weight`, one who held as
much as their share half of it, one who held it all little. `oddl jobs --priority` shows
each factor; `[priority]` in the limits file sets the weights (docs/arbiter.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from oddl.controller.base.config import ConfigModel
from pydantic import Field


class Weights(ConfigModel):
    """`[priority]` of the limits file."""

    age_per_hour: float = Field(default=10.0, ge=0, le=1000, allow_inf_nan=False)
    max_age_hours: float = Field(default=168.0, ge=0, le=24 * 366, allow_inf_nan=False)
    share_weight: float = Field(default=100.0, ge=0, le=10_000, allow_inf_nan=False)
    half_life_s: float = Field(default=7 * 86400.0, gt=0, le=366 * 86400, allow_inf_nan=False)


@dataclass(frozen=True)
class Priority:
    """A queued job's priority and its factors."""

    base: int
    age: float
    share: float

    @property
    def total(self) -> float:
        return self.base + self.age + self.share

    def public(self) -> dict[str, float]:
        """As a job's listing adds it (its `priority` is the base)."""
        return {"priority_now": round(self.total, 3), "age": round(self.age, 3),
                "share": round(self.share, 3)}


def share_factors(usage: dict[str, float]) -> dict[str, float]:
    """Per user with usage, 2 ** -(U / S) (a user not named: 1.0)."""
    total = sum(usage.values())
    if total <= 0:
        return {}
    n = sum(1 for u in usage.values() if u > 0)
    return {user: 2.0 ** -((u / total) * n) for user, u in usage.items()}


def priority_of(base: int, queued_s: float, user: str, factors: dict[str, float],
                w: Weights) -> Priority:
    age = w.age_per_hour * min(max(queued_s, 0.0) / 3600, w.max_age_hours)
    return Priority(base, age, w.share_weight * factors.get(user, 1.0))
