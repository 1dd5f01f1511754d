"""TotientPerms as TopoOpt's released code chooses jumps (hipersys-team/FlexFlow
`construct_candidate_jumps`, `choose_n_geo`), worked by hand, and routes over them against
brute force."""

from __future__ import annotations

from collections import deque
from math import gcd
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from oddl.app.cli import main
from oddl.controller.base.clock import Clock
from oddl.controller.base.collectives import build, check_balanced
from oddl.controller.base.config import NetworkSpec
from oddl.controller.base.jumps import JumpSet, candidate_jumps, jump_routes, totient_jumps
from oddl.sim.clock import VirtualClockLoop
from oddl.sim.networks.baselines import build_network


def test_candidates_per_group_size() -> None:
    # g = N: the totatives of N; g | N: base = N / g times the totatives of g
    assert candidate_jumps(12) == [1, 5, 7, 11]
    assert candidate_jumps(12, group=4) == [3, 9]  # base 3, k in {1, 3}
    assert candidate_jumps(12, group=6) == [2, 10]  # base 2, k in {1, 5}
    assert candidate_jumps(12, group=3) == [4, 8]  # base 4, k in {1, 2}
    with pytest.raises(ValueError, match="group size 5 must be at least 2 and divide 12"):
        candidate_jumps(12, group=5)


@pytest.mark.parametrize("n,d,bidir,group,want", [
    # all four candidates of 12 fit in d = 4 (the paper's example)
    (12, 4, False, None, [1, 5, 7, 11]),
    # C = odd 1..15, r = 15^(1/2) = 3.87: targets 1, 3.87, 15 -> 1, 5, 15 (lower bound:
    # the nearest-candidate rule took 3 and had diameter 5, not 4)
    (16, 3, False, None, [1, 5, 15]),
    # r = 15^(1/3) = 2.47: targets 1, 2.47, 6.08, 15 -> 1, 3, 7, 15
    (16, 4, False, None, [1, 3, 7, 15]),
    # bidirectional: m = d/2 = 2, r = 15^(1/2): 1, 3.87 -> 1, 5, and the reverses 15, 11
    (16, 4, True, None, [1, 5, 11, 15]),
    # C = [1, 7, 11, 13, 17, 19, 23, 29], r = 29^(1/5) = 1.96: targets 1, 1.96, 3.85, 7.54,
    # 14.8, 29 -> 1, 7, (7 taken) 11, (11 taken) 13, 17, 29: the walk skips used ones
    (30, 6, False, None, [1, 7, 11, 13, 17, 29]),
    # C = [1, 3, 5, 7], r = 7^(1/2): the last target is 7.000000000000001 in floating
    # point, past every candidate (the C++ reads past the end): the largest, 7
    (8, 3, False, None, [1, 3, 7]),
    # a group of 6 in 12 nodes: C = [2, 10], both
    (12, 2, False, 6, [2, 10]),
    # more ports than candidates: every candidate, once
    (6, 5, False, None, [1, 5]),
    # one jump: the smallest candidate
    (10, 1, False, None, [1]),
])
def test_hand_worked_jumps(n: int, d: int, bidir: bool, group: int | None,
                           want: list[int]) -> None:
    assert totient_jumps(n, d, group=group, bidirectional=bidir) == want


def test_bidirectional_needs_two_ports() -> None:
    with pytest.raises(ValueError, match="degree >= 2"):
        totient_jumps(16, 1, bidirectional=True)


def _bfs_hops(n: int, jumps: list[int], src: int) -> list[int]:
    dist = [-1] * n
    dist[src] = 0
    q = deque([src])
    while q:
        u = q.popleft()
        for j in jumps:
            if dist[(u + j) % n] < 0:
                dist[(u + j) % n] = dist[u] + 1
                q.append((u + j) % n)
    return dist


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 160), d=st.integers(2, 8), bidir=st.booleans())
def test_every_pair_routable_in_bfs_hops(n: int, d: int, bidir: bool) -> None:
    jumps = totient_jumps(n, d, bidirectional=bidir)
    assert jumps and all(gcd(j, n) == 1 for j in jumps)
    assert len(jumps) <= d and jumps == sorted(set(jumps))
    routes = jump_routes(n, jumps)
    for off, r in enumerate(routes):  # each route reaches its offset
        assert sum(r) % n == off and set(r) <= set(jumps)
    for src in range(0, n, max(1, n // 5)):  # circulant: the same hop count from anywhere
        hops = _bfs_hops(n, jumps, src)
        assert all(hops[(src + off) % n] == len(routes[off]) for off in range(n))
    s = JumpSet.of(n, jumps)
    assert s.diameter == max(_bfs_hops(n, jumps, 0))
    assert s.mean_hops == pytest.approx(sum(_bfs_hops(n, jumps, 0)) / (n - 1))


def test_diameters_stay_near_d_n_to_the_1_over_d() -> None:
    # published TotientPerms: diameter O(d N^(1/d)); at 1024 nodes, d = 4: 21 hops, not
    # hundreds (d N^(1/d) = 22.6)
    s = JumpSet.of(1024, totient_jumps(1024, 4))
    assert s.jumps == (1, 11, 103, 1023) and s.diameter == 21
    assert "diameter 21" in str(s) and "d·N^(1/d) = 22.6" in str(s)


def test_topoopt_network_reports_its_topology() -> None:
    loop = VirtualClockLoop()
    net = build_network(NetworkSpec(name="t", kind="topoopt", degree=4, bidirectional=True),
                        Clock(loop), [f"h{i}" for i in range(16)], 100.0, lambda f: None)
    loop.close()
    assert net.jumps == [1, 5, 11, 15]
    assert net.describe() == {"diameter": 4, "mean_hops": 2.133}
    sched = build("totientrings", 16, 16_000, 4, 4, 4, bidirectional=True)
    check_balanced(sched)  # four rings, two each way
    assert {d for s in sched[0][:1] for d, _ in s.sends} == {1, 5, 11, 15}


def test_plan_prints_the_jumps_diameter_and_mean_hops(root: Path) -> None:
    r = CliRunner().invoke(main, ["plan", str(root / "hw_configs" / "prototype-4node.toml"),
                                  "--strategy", "totientperms"])
    assert r.exit_code == 0, r.output
    assert "totientperms, per WSS group: N=4 jumps [1, 3]: diameter 2, mean 1.33 hops" \
        in r.output


def test_bidirectional_with_one_port_is_a_config_error(tmp_path: Path, root: Path) -> None:
    from oddl.controller.base.config import ConfigError, load_experiment

    exp = tmp_path / "e.toml"
    exp.write_text((root / "experiments" / "table1-resnet50.toml").read_text().replace(
        "[reference]", '[[networks]]\nname = "t"\nkind = "topoopt"\ndegree = 1\n'
                       "bidirectional = true\n\n[reference]"))
    with pytest.raises(ConfigError) as ei:
        load_experiment(exp, root / "hw_configs" / "prototype-4node.toml")
    issue = ei.value.issues[0]
    assert issue.path == "networks[2]" and "degree >= 2" in issue.reason, issue
