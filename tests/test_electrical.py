"""The ideal electrical switch: max-min fair sharing, closed-form times when uncongested."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from oddl.controller.base.clock import Clock
from oddl.controller.base.messages import Flow
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.electrical import ElectricalSwitch, max_min_rates


def test_max_min_hand_worked() -> None:
    # a->b, a->c share a's uplink; d->c shares c's downlink with a->c
    links = [("up-a", "down-b"), ("up-a", "down-c"), ("up-d", "down-c")]
    caps = {k: 10.0 for ls in links for k in ls}
    assert max_min_rates(links, caps) == [5.0, 5.0, 5.0]
    # three into one: a third each; a lone flow elsewhere gets everything
    links = [("u1", "d"), ("u2", "d"), ("u3", "d"), ("u4", "d5")]
    caps = {k: 9.0 for ls in links for k in ls}
    assert max_min_rates(links, caps) == [3.0, 3.0, 3.0, 9.0]
    # unequal capacities: the bottleneck leaves the rest to the other flow
    links = [("x", "y"), ("x", "z")]
    assert max_min_rates(links, {"x": 10.0, "y": 2.0, "z": 10.0}) == [2.0, 8.0]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=20),
       st.lists(st.floats(1.0, 100.0), min_size=12, max_size=12))
def test_max_min_property(pairs: list[tuple[int, int]], cap_list: list[float]) -> None:
    links = [(f"u{a}", f"d{b}") for a, b in pairs]
    caps = {f"u{i}": cap_list[i] for i in range(6)} | {f"d{i}": cap_list[6 + i]
                                                        for i in range(6)}
    rates = max_min_rates(links, caps)
    load: dict[str, float] = {}
    for ls, r in zip(links, rates, strict=True):
        for k in ls:
            load[k] = load.get(k, 0.0) + r
    for k, v in load.items():  # no link over capacity
        assert v <= caps[k] * (1 + 1e-9)
    for ls, r in zip(links, rates, strict=True):  # every flow bottlenecked somewhere
        assert any(abs(load[k] - caps[k]) <= 1e-9 * caps[k] and
                   all(r >= r2 - 1e-9 for ls2, r2 in zip(links, rates, strict=True) if k in ls2)
                   for k in ls)


def _run(flows: list[tuple[str, str, int, int]]) -> dict[int, int]:
    loop = VirtualClockLoop()
    clock = Clock(loop)
    got: dict[int, int] = {}
    sw = ElectricalSwitch(clock, ["a", "b", "c", "d"], 100.0, 1000,
                          lambda f: got.__setitem__(f.id, clock.now_ns()))
    for i, (s, d, b, t) in enumerate(flows):
        clock.call_at_ns(t, sw.submit, Flow(i, s, d, b))
    loop.run_until_complete(asyncio.sleep(1.0))
    loop.close()
    return got


def test_uncongested_flow_time_is_closed_form() -> None:
    assert _run([("a", "b", 125_000, 0)]) == {0: 10_000 + 1000}
    # a permutation: every flow at full rate at once
    got = _run([("a", "b", 125_000, 0), ("b", "a", 125_000, 0), ("c", "d", 125_000, 0)])
    assert set(got.values()) == {11_000}


def test_shared_uplink_halves_then_recovers() -> None:
    # two flows from a: both at 50 Gb/s until the small one ends, then the big one at 100
    got = _run([("a", "b", 62_500, 0), ("a", "c", 125_000, 0)])
    assert got[0] == 10_000 + 1000  # 5 Mbit... 0.5 Mbit at 50 Gb/s = 10 us
    assert got[1] == 15_000 + 1000  # 0.5 Mbit left at 100 Gb/s after 10 us
