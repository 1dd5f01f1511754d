"""Recovery, as data: who takes a dead rank's place, and what each fault cost the run.

The runner stops a job for a fault (backend.JobStopped), lets the health monitor settle
on a diagnosis, and asks here what the next plan runs on, per the experiment's
`recovery` policy:
- relay: routes go round dead relays, dead WSSs and bad links (the planner's `Avoid`);
  a dead rank stops the run, since nothing can stand in for it;
- spare: each dead rank moves to the first free live node, in grid order;
- shrink: the job goes on with its live ranks, its collective rebuilt for their number
  (ring, or halving-doubling with the ranks over a power of two folded in first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oddl.controller.base.faultkinds import KINDS
from oddl.controller.service.backend import Injected, RunFailed
from oddl.controller.service.health import Diagnosis

SHRINKABLE = ("ring", "hd")  # collectives that are defined for any number of ranks


def replace_ranks(ranks: list[str], dead: set[str], nodes: Sequence[str], policy: str,
                  collective: str) -> tuple[list[str], str]:
    """The ranks (and collective) the job runs on next; RunFailed if the policy cannot."""
    lost = [(i, n) for i, n in enumerate(ranks) if n in dead]
    if not lost:
        return ranks, collective
    names = ", ".join(f"rank {i} on {n}" for i, n in lost)
    if policy == "relay":
        raise RunFailed(f"{names}: dead, and recovery = 'relay' only routes round dead relays "
                        f"and WSSs; set recovery = 'spare' or 'shrink' to go on without it")
    if policy == "spare":
        free = [n for n in nodes if n not in ranks and n not in dead]
        if len(free) < len(lost):
            raise RunFailed(f"{names}: dead, and only {len(free)} spare nodes are left")
        out = list(ranks)
        for (i, _n), spare in zip(lost, free, strict=False):
            out[i] = spare
        return out, collective
    live = [n for n in ranks if n not in dead]
    if len(live) < 2:
        raise RunFailed(f"{names}: dead; fewer than 2 ranks are left to shrink to")
    return live, collective if collective in SHRINKABLE else "ring"


@dataclass
class Recovery:
    """One stop and resume: what stopped the job, what the arbiter did, what it cost."""

    t_stop_ns: int
    t_resume_ns: int
    t_last_ns: int  # the end of the last iteration recorded before the stop
    diagnoses: list[Diagnosis]
    lost: bool  # an iteration was cut short (and ran again)
    flows_lost: int
    replanned: bool


@dataclass(frozen=True)
class FaultRow:
    kind: str
    target: str
    at_ns: int
    detected_after_ns: int | None
    recovered_after_ns: int | None
    replans: int
    iterations_lost: int
    flows_retried: int
    recovered: bool | None  # None: it reached the testbed after the run had ended

    def public(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _explains(x: Injected, d: Diagnosis) -> bool:
    return (d.t_ns >= x.at_ns and d.kind in KINDS[x.spec.kind].found_as
            and d.target == x.spec.target)


def _handled(recoveries: Sequence[Recovery], d: Diagnosis) -> Recovery | None:
    return next((r for r in recoveries if any(e is d for e in r.diagnoses)), None)


def fault_rows(injected: Sequence[Injected], diagnoses: Sequence[Diagnosis],
               recoveries: Sequence[Recovery], completed: bool,
               ended_ns: int | None = None) -> list[FaultRow]:
    """One row per injected fault (and per diagnosis no injection explains: a real
    fault, or another one's collateral). A fault that reached the testbed only once the
    run's last iteration had ended (`ended_ns`; a late controller on a loaded host), and
    was found by nothing, tested nothing: its `recovered` is None, not the run's outcome."""
    rows = []
    used: set[int] = set()
    for x in injected:
        d = next((d for d in diagnoses if id(d) not in used and _explains(x, d)), None)
        if d is not None:
            used.add(id(d))
        # the recovery that handled its diagnosis, else one that stopped a job while it
        # lasted (a bus outage cuts the job before the watch has concluded)
        until = x.until_ns if x.until_ns is not None else 1 << 62
        rec = (_handled(recoveries, d) if d is not None else None) or next(
            (r for r in recoveries if x.at_ns <= r.t_stop_ns <= until), None)
        rows.append(FaultRow(
            x.spec.kind, x.spec.target, x.at_ns,
            d.t_ns - x.at_ns if d is not None else None,
            rec.t_resume_ns - x.at_ns if rec is not None else None,
            int(rec.replanned) if rec is not None else 0,
            int(rec.lost) if rec is not None else 0,
            rec.flows_lost if rec is not None and rec.lost else x.retries,
            None if d is None and ended_ns is not None and x.at_ns >= ended_ns
            else completed))
    for d in diagnoses:
        if id(d) in used:
            continue
        rec = _handled(recoveries, d)
        rows.append(FaultRow(d.kind, d.target, d.t_ns, 0,
                             rec.t_resume_ns - d.t_ns if rec is not None else None,
                             int(rec.replanned) if rec is not None else 0,
                             int(rec.lost) if rec is not None else 0,
                             rec.flows_lost if rec is not None else 0, completed))
    return rows
