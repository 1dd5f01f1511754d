from __future__ import annotations

import pytest
from oddl.controller.collectives import build, check_balanced, halving_doubling, ring


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
    with pytest.raises(ValueError, match="power-of-two"):
        halving_doubling(6, 100)
