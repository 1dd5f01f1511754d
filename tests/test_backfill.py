"""The arbiter's queue (issue 44): EASY backfill starts a job past a blocked bigger one
exactly when, by its time limit, it cannot delay the bigger one's start; held jobs and
users at a limit block nobody."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from oddl.controller.base.topology import Grid
from oddl.controller.service.jobs import JobRequest
from oddl.controller.service.placing import Running, backfill, reservation
from oddl.controller.stage1.placement import Partition

from tests.helpers import make_testbed

S = 1_000_000_000  # ns a second
GRID = Grid.from_testbed(make_testbed(2, 4))  # 2 rows x 4 columns


def job(name: str, ranks: int, limit_s: int, shape: str = "any") -> JobRequest:
    return JobRequest(name, "resnet50", "ring", ranks, 10, 1, 0, shape, 1,
                      time_limit_ns=limit_s * S)


def row(r: int) -> frozenset[str]:
    return frozenset(GRID.at[(r, c)] for c in range(GRID.cols))


def test_a_small_job_that_ends_before_the_reservation_backfills() -> None:
    # row 0 runs a job for 100 s more; row 1 is free; the head wants both rows (8 ranks)
    free = set(row(1))
    running = [Running(100 * S, row(0))]
    queue = [job("big", 8, 50), job("small", 2, 60)]
    assert reservation(GRID, free, running, queue[0]) == (100 * S, row(0) | row(1))
    started = backfill(GRID, set(free), queue, running, now_ns=0)
    assert [r.name for r, _ in started] == ["small"]


def test_a_small_job_that_would_delay_the_reservation_waits() -> None:
    free = set(row(1))
    running = [Running(100 * S, row(0))]
    queue = [job("big", 8, 50), job("small", 2, 101)]  # one second too long
    assert backfill(GRID, set(free), queue, running, now_ns=0) == []
    # and at its limit exactly, it cannot delay: it starts
    queue = [job("big", 8, 50), job("small", 2, 100)]
    assert [r.name for r, _ in backfill(GRID, set(free), queue, running, 0)] == ["small"]


def test_a_long_job_off_the_reserved_nodes_backfills() -> None:
    # the head wants 4 ranks: row 0 holds them once its job leaves; row 1 is free and
    # not reserved, so a long job there cannot delay it
    free = set(row(1)) - {GRID.at[(1, 3)]}  # 3 cells of row 1 free
    running = [Running(100 * S, row(0)), Running(500 * S, frozenset({GRID.at[(1, 3)]}))]
    queue = [job("head", 4, 50, "row"), job("long", 2, 10_000)]
    when, nodes = reservation(GRID, free, running, queue[0]) or (0, frozenset())
    assert (when, nodes) == (100 * S, row(0))
    started = backfill(GRID, set(free), queue, running, now_ns=0)
    assert [r.name for r, _ in started] == ["long"]
    assert not set(started[0][1].nodes) & nodes


def test_held_jobs_and_users_at_a_limit_block_nobody() -> None:
    queue = [job("held", 8, 50), job("next", 4, 50)]
    started = backfill(GRID, set(GRID.nodes), queue, [], 0,
                       may_start=lambda r, _placed: r.name != "held")
    assert [r.name for r, _ in started] == ["next"]


def _head_start(queue: list[JobRequest], running: list[Running], started: list[
        tuple[JobRequest, Partition]]) -> int:
    """When the first job not started can start at the latest, every job running to its
    limit: a replay of the releases in time order."""
    head = next(r for r in queue if r.name not in {s.name for s, _ in started})
    everyone = running + [Running(r.time_limit_ns, frozenset(p.nodes)) for r, p in started]
    held = set().union(*(r.nodes for r in everyone)) if everyone else set()
    found = reservation(GRID, set(GRID.nodes) - held, everyone, head)
    return found[0] if found else -1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 300)), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(1, 8), st.integers(1, 300)), min_size=2, max_size=6))
def test_backfill_never_delays_the_first_job_that_waits(
        runs: list[tuple[int, int]], queued: list[tuple[int, int]]) -> None:
    """Whatever runs and waits: the blocked head starts no later with the backfilled jobs
    than without them."""
    free = set(GRID.nodes)
    running = []
    for k, (ranks, limit) in enumerate(runs):  # jobs already on the grid, as placed
        got = backfill(GRID, free, [job(f"r{k}", ranks, limit)], [], 0)
        if got:
            running.append(Running(limit * S, frozenset(got[0][1].nodes)))
    queue = [job(f"q{k}", ranks, limit) for k, (ranks, limit) in enumerate(queued)]
    started = backfill(GRID, set(free), queue, running, 0)
    names = [r.name for r, _ in started]
    blocked = next((r for r in queue if r.name not in names), None)
    if blocked is None:
        return
    first = queue.index(blocked)
    in_order = [s for s in started if queue.index(s[0]) < first]
    alone = _head_start(queue, running, in_order)
    with_backfill = _head_start(queue, running, started)
    assert alone == -1 or with_backfill <= alone, (names, alone, with_backfill)
    assert dataclasses.asdict(blocked)  # the blocked head itself was never started


def test_a_head_job_waiting_for_a_dead_node_blocks_nobody() -> None:
    """Reproducer (issue 64): a node out of service, and a head job that no rectangle of
    the nodes in service can hold: `reservation` gives None, and every job behind the head
    waited (a 2-rank, 10-s job with 5 nodes free, until the node came back)."""
    dead = GRID.at[(0, 0)]
    free = set(GRID.nodes) - {dead}  # 7 in service, all free, nothing running
    queue = [job("whole", 8, 50), job("small", 2, 10), job("row", 4, 10, "row")]
    assert reservation(GRID, free, [], queue[0]) is None
    started = backfill(GRID, set(free), queue, [], now_ns=0)
    assert [r.name for r, _ in started] == ["small", "row"]
    # the next job that waits for running jobs gets the reservation, as the head would
    running = [Running(100 * S, row(1))]
    free = set(row(0)) - {dead}
    queue = [job("whole", 8, 50), job("six", 6, 50), job("long", 2, 1000)]
    assert [r.name for r, _ in backfill(GRID, set(free), queue, running, 0)] == []
    assert [r.name for r, _ in backfill(GRID, set(free), queue[:1] + queue[2:], running,
                                        0)] == ["long"]


def test_a_job_that_would_run_into_a_maintenance_window_keeps_off_its_nodes() -> None:
    """Issue 64: maintenance reservations. Row 0 is reserved from 100 s: a job whose limit
    ends before then may use it; a longer one goes to row 1, or waits ("maintenance")."""
    def maint(end_ns: int, _job: str) -> frozenset[str]:
        return row(0) if end_ns > 100 * S else frozenset()

    queue = [job("short", 4, 50, "row"), job("long", 4, 500, "row"), job("longer", 4, 500,
                                                                       "row")]
    pending: dict[str, tuple[str, int | None, frozenset[str]]] = {}
    started = backfill(GRID, set(GRID.nodes), queue, [], 0, pending=pending,
                       maintenance=maint)
    assert [(r.name, p.rows) for r, p in started] == [("short", (0,)), ("long", (1,))]
    # its reservation keeps off row 0 too: row 1, once "long" has left
    assert pending == {"longer": ("resources", 500 * S, row(1))}
    # nothing running: it fits only on the reserved row, and waits for the window
    pending.clear()
    started = backfill(GRID, set(row(0)), queue[2:], [], 0, pending=pending,
                       maintenance=maint)
    assert started == [] and pending == {"longer": ("maintenance", None, frozenset())}


def test_a_reservation_keeps_its_nodes_for_its_holders_jobs() -> None:
    """Issue 86: an operator reserves row 0 for bob: alice's jobs keep off it (a whole-grid
    one waits, saying so), bob's may use it."""
    def reserved(_end_ns: int, job: str) -> frozenset[str]:
        return frozenset() if job.startswith("bob") else row(0)

    pending: dict[str, tuple[str, int | None, frozenset[str]]] = {}
    queue = [job("alice-all", 8, 50, "grid"), job("alice-row", 4, 50, "row"),
             job("bob-row", 4, 50, "row")]
    started = backfill(GRID, set(GRID.nodes), queue, [], 0, pending=pending,
                       maintenance=reserved)
    assert [(r.name, p.rows) for r, p in started] == [("alice-row", (1,)), ("bob-row", (0,))]
    assert pending == {"alice-all": ("maintenance", None, frozenset())}
