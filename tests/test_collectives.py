from __future__ import annotations

import pytest
from oddl.controller.base.collectives import build, check_balanced, halving_doubling, ring


@pytest.mark.parametrize("kind,n,rows,cols", [("hd", 8, 2, 4), ("ring", 6, 2, 3),
                                              ("hier2d", 12, 3, 4), ("hd", 4, 1, 4)])
def test_every_byte_accounted(kind: str, n: int, rows: int, cols: int) -> None:
    s = build(kind, n, 1_000_003, rows, cols)
    check_balanced(s)


def test_ring_shape() -> None:
    s = ring(5, 1000)
    assert all(len(steps) == 8 for steps in s)
    assert sum(st.sends[0][1] for st in s[0]) == 2 * 4 * 200


def test_hd_shape_and_partners() -> None:
    s = halving_doubling(8, 800)
    assert [st.sends[0] for st in s[0]] == [(1, 400), (2, 200), (4, 100), (4, 100), (2, 200),
                                            (1, 400)]
    with pytest.raises(ValueError, match="at least one rank"):
        halving_doubling(0, 100)


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12])
def test_hd_folds_the_ranks_over_a_power_of_two(n: int) -> None:
    """A job shrunk round a dead rank runs HD on any count: the ranks over the power of two
    p hand their gradient to a partner first and get the result back last."""
    s = halving_doubling(n, 1200)
    check_balanced(s)
    p = 1 << (n.bit_length() - 1)
    assert {len(steps) for steps in s} == {2 * (p.bit_length() - 1) + 2}
    for e in range(p, n):
        assert s[e][0].sends == ((e - p, 1200),) and s[e][-1].recv_bytes == 1200
        assert s[e - p][0].recv_bytes == 1200 and s[e - p][-1].sends == ((e, 1200),)
    assert s[n - p][0].recv_bytes == 0  # no partner: waits through the fold
