"""What the controller makes of a stopped job's ranks' words (drivers/job_tally.py): the
reports a broker took with it, said again, each taken once, and the carry of the
iteration they then name (issue 62)."""

from __future__ import annotations

import asyncio

from oddl.controller.service.backend import Iteration, JobOutcome, JobStopped
from oddl.controller.stage2.control_unit import Timing
from oddl.controller.stage2.job import JOB_VERSION, JobEvent, JobSpec, schedule_of
from oddl.drivers.job_tally import Carrying, JobTally

TIMING = Timing(11, 2, 50, 1000, 1000, 5000, 3)
# a 2-rank ring: in each step, rank 0 sends to rank 1 and rank 1 to rank 0
SPEC = JobSpec(JOB_VERSION, "j", "ring", 2000, 1, 2, 4, False, ["a", "b"], ["a", "b"], 6,
               10_000_000, False, TIMING, {})
CARRY = {"a": [(1, 0, 0)], "b": [(0, 0, 0)]}  # what step 0 delivers to each


def report(node: str, i: int) -> JobEvent:
    return JobEvent(JOB_VERSION, "j", "iteration", node, iteration=i, t_start=0, t_end=1,
                    stats={"flows": 2 * (i + 1)})


def failed(node: str, i: int) -> JobEvent:
    return JobEvent(JOB_VERSION, "j", "failed", node, iteration=i, carried=True,
                    carry=CARRY[node], carry_t0=5, error="lost its connection to the broker")


def stopped_in(i: int, heard: list[JobEvent]) -> tuple[Carrying, list[int], list[str]]:
    """The job as the controller left it when the broker went, in iteration `i`, having
    heard `heard` (iterations before `i` complete)."""
    recorded: list[int] = []
    rejected: list[str] = []
    tally = JobTally(SPEC, lambda it: recorded.append(it.iteration), rejected.append)
    tally.published()
    for n in ("a", "b"):
        tally.heard(JobEvent(JOB_VERSION, "j", "ready", n))
    for j in range(i):
        for n in ("a", "b"):
            tally.heard(report(n, j))
    for ev in heard:
        tally.heard(ev)
    stop = JobStopped("the broker went away", tally.next_iteration, True,
                      JobOutcome(0, 0, {}, []))
    c = Carrying(stop, tally, {"a": 0, "b": 1}, schedule_of(SPEC), rejected.append,
                 done=asyncio.Event())
    return c, recorded, rejected


def test_reports_the_broker_took_are_taken_once_and_the_next_iteration_carried() -> None:
    """Every rank had reported iteration 2 and gone on to 3; the controller had heard a's
    report only when the broker went. Said again on reconnect (each rank: its last two
    reports, then its carry of 3, a's before b's reports arrive): 2 is recorded once, and
    the job goes on from 3 with what 3 delivered."""
    c, recorded, rejected = stopped_in(2, [report("a", 2)])
    assert c.stop.next_iteration == 2 and recorded == [0, 1]
    for ev in (report("a", 1), report("a", 2), failed("a", 3),
               report("b", 1), report("b", 2), failed("b", 3)):
        c.heard(ev)
    assert recorded == [0, 1, 2] and rejected == []
    assert c.done.is_set() and c.stop.next_iteration == 3
    assert c.stop.carry == (5, [(0, 0, 0), (1, 0, 0)])
    for ev in (report("b", 2), failed("b", 3)):  # said a third time: no news
        c.heard(ev)
    assert recorded == [0, 1, 2] and rejected == []


def test_a_rank_that_had_not_gone_on_leaves_no_carry() -> None:
    """b had reported 2 but not heard a's report: its carry is of 2, the one a's repeat
    then completes; 3 cannot be carried, it runs in full."""
    c, recorded, _ = stopped_in(2, [report("b", 2)])
    for ev in (failed("b", 2), report("a", 2), failed("a", 3)):
        c.heard(ev)
    assert recorded == [0, 1, 2] and c.stop.next_iteration == 3
    assert c.done.is_set() and c.stop.carry is None


def test_carries_of_an_iteration_never_seen_to_end_are_no_carry() -> None:
    """Without the reports said again (a node program of before), each rank's carry names
    iteration 3, which the controller never saw begin: once every rank has said, there is
    no carry, and 2 runs again (at once: no waiting out the carry's time)."""
    c, recorded, _ = stopped_in(2, [report("a", 2)])
    c.heard(failed("a", 3))
    assert not c.done.is_set()  # b's report of 2 may yet come
    c.heard(failed("b", 3))
    assert c.done.is_set() and c.stop.carry is None and recorded == [0, 1]
    assert c.stop.next_iteration == 2


def test_the_iteration_recorded_late_is_the_one_reported() -> None:
    got: list[Iteration] = []
    c, _, _ = stopped_in(2, [report("a", 2)])
    c.tally.on_iteration = got.append
    c.heard(report("b", 2))
    assert [it.iteration for it in got] == [2]
