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
SPEC = JobSpec(v=JOB_VERSION, job="j", collective="ring", size=2000, rows=1, cols=2, degree=4,
               bidirectional=False, ranks=["a", "b"], nodes=["a", "b"], iterations=6,
               compute_ns=10_000_000, nic_sync=False, timing=TIMING, routes={})
CARRY = {"a": [(1, 0, 0)], "b": [(0, 0, 0)]}  # what step 0 delivers to each


def report(node: str, i: int) -> JobEvent:
    return JobEvent(JOB_VERSION, "j", "iteration", node, iteration=i, t_start=0, t_end=1,
                    stats={"flows": 2 * (i + 1)})


def failed(node: str, i: int, again: int = 0, done_here: bool = False) -> JobEvent:
    """A rank's "failed" event: in iteration i, with what step 0 delivered to it; or, its
    part of i done, all of i and nothing yet of i + 1."""
    if done_here:
        return JobEvent(JOB_VERSION, "j", "failed", node, iteration=i, carried=True,
                        carry=[(1 - INDEX[node], s, 0) for s in range(2)], carry_t0=5,
                        done_here=True, early=[], early_t0=9, again=again,
                        error="lost its connection to the broker")
    return JobEvent(JOB_VERSION, "j", "failed", node, iteration=i, carried=True,
                    carry=CARRY[node], carry_t0=5, again=again,
                    error="lost its connection to the broker")


INDEX = {"a": 0, "b": 1}


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


def test_first_tellings_before_the_reports_said_again_wait_for_them() -> None:
    """Found in an emu drill (issue 62): the nodes' first "failed" events, queued by paho
    while the broker was down, came before the reports said again, each naming iteration
    3 while the controller was at 2: taken as final, no carry. A telling that says it will
    be said again (`again` 1) is waited for."""
    c, recorded, _ = stopped_in(2, [])
    for ev in (failed("a", 3, again=1), failed("b", 3, again=1)):
        c.heard(ev)
    assert not c.done.is_set()
    for ev in (report("a", 2), failed("a", 3, again=2), report("b", 2)):
        c.heard(ev)
    assert recorded == [0, 1, 2] and c.done.is_set()
    assert c.stop.next_iteration == 3 and c.stop.carry == (5, [(0, 0, 0), (1, 0, 0)])


def test_a_rank_done_with_its_part_gives_either_iteration_its_share() -> None:
    """b had finished its part of 2 (reported) but not heard a's report, so it had not
    begun 3; a was still in 2. The iteration cut is 2: b's share is all it had of 2."""
    c, recorded, _ = stopped_in(2, [report("b", 2)])
    c.heard(failed("b", 2, done_here=True))
    c.heard(failed("a", 2))
    assert recorded == [0, 1] and c.done.is_set()
    assert c.stop.carry == (5, [(0, 0, 0), (0, 1, 0), (1, 0, 0)])
    # and the same b, had a finished too and its report reached the controller again: 3
    c, recorded, _ = stopped_in(2, [report("b", 2)])
    for ev in (failed("b", 2, done_here=True), report("a", 2), failed("a", 2, done_here=True)):
        c.heard(ev)
    assert recorded == [0, 1, 2] and c.stop.next_iteration == 3
    assert c.done.is_set() and c.stop.carry == (9, [])


def test_the_iteration_recorded_late_is_the_one_reported() -> None:
    got: list[Iteration] = []
    c, _, _ = stopped_in(2, [report("a", 2)])
    c.tally.on_iteration = got.append
    c.heard(report("b", 2))
    assert [it.iteration for it in got] == [2]


def test_a_rank_done_with_its_part_carries_the_next_iteration_early_arrivals() -> None:
    """Issue 62 (found under a busy core: iterations_lost 1 in 2 of 18 drills): a rank
    that had reported iteration 2 but not yet heard every other report when the broker
    went said its carry was of 2; the others, gone on to 3, said 3: no carry. A rank whose
    part of its iteration is done carries the next one: what of it came early."""
    from oddl.controller.base.clock import Clock
    from oddl.controller.base.messages import Flow
    from oddl.controller.stage2.workloads import CollectiveEngine
    from oddl.sim.clock import VirtualClockLoop

    loop = VirtualClockLoop()
    try:
        sched = schedule_of(SPEC)
        eng = CollectiveEngine(Clock(loop), sched, ["a", "b"], lambda _f: None, local=["a"])
        done: list[int] = []
        eng.start_iteration(2, 0, done.append)
        loop.run_until_complete(asyncio.sleep(1e-6))
        for s, st in enumerate(sched[1]):  # everything b sends a in iteration 2
            for j, (dst, nbytes) in enumerate(st.sends):
                if dst == 0:
                    eng.on_delivered(Flow(100 + 10 * s + j, "b", "a", nbytes, 2, s))
        loop.run_until_complete(asyncio.sleep(1e-6))
        assert done and eng.pending == 0  # a's part of 2 is done: it reports 2
        assert eng.carry_of(3) == (done[0], [])  # nothing of 3 yet
        nbytes = sched[1][0].sends[0][1]
        eng.on_delivered(Flow(999, "b", "a", nbytes, 3, 0))  # b has gone on: early
        assert eng.carry_of(3) == (done[0], [(1, 0, 0)])
        assert eng.carry_of(4) is None
    finally:
        loop.close()


def test_reports_still_queued_when_the_job_stopped_are_taken_in_order() -> None:
    """Reproducer (issue 62's soak, the corrupt-link drill): the controller, its loop 111 ms
    late, stopped the job in iteration 5 with every rank's reports of 5 and 6 still in its
    queue; the ranks' "failed" events said 7 and the cut iteration ran again in full ("n0-0
    says iteration 7, ..."). The queued reports are taken first, in iteration order (a's
    report of 3 came before b's of 2), and 4 is carried."""
    c, recorded, rejected = stopped_in(2, [])
    c.heard_queued([report("a", 2), report("a", 3), report("b", 2), report("b", 3)])
    assert recorded == [0, 1, 2, 3] and c.stop.next_iteration == 4 and rejected == []
    for n in ("a", "b"):
        c.heard(failed(n, 4))
    assert c.done.is_set() and c.stop.carry == (5, [(0, 0, 0), (1, 0, 0)])
