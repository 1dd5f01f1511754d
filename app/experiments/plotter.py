"""A run's figure, drawn beside the run.

matplotlib takes a quarter of a second to import, and a short run (README's Table 1) is
over in one: a third of its command was its plot. When a core is spare, a helper process
is started with the run and imports matplotlib on it while the networks run; at the end
it is sent the figure's data (JSON, on its stdin) and draws the file. Where it cannot (no
spare core, or it failed, or died), the figure is drawn here, from the same data by the
same code (`figures.draw`), so the file is the same either way; an error in the drawing
shows from here. A helper whose run ended without a figure (stopped, failed, killed) reads
the end of its stdin and exits. It holds 80 MB (matplotlib) while it waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

DRAW_TIMEOUT_S = 120.0


class Plotter:
    """A run's figure: its helper started now (where a core is spare), drawn by `draw`."""

    def __init__(self) -> None:
        self.helper: subprocess.Popen[str] | None = None
        self.by_helper = False  # the last figure drawn was the helper's
        if len(os.sched_getaffinity(0)) > 1:
            with contextlib.suppress(OSError):
                self.helper = subprocess.Popen(
                    [sys.executable, "-m", "oddl.app.experiments.plotter"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, text=True)

    def draw(self, kind: str, args: Mapping[str, Any], out: Path) -> Path:
        """The figure `kind` (figures.draw) of `args` into `out`, by the helper if it can."""
        from oddl.app.experiments.figures import draw

        request = json.dumps({"kind": kind, "args": args, "out": str(out.resolve())})
        p, self.helper = self.helper, None
        if p is not None:
            try:
                said, _ = p.communicate(request + "\n", timeout=DRAW_TIMEOUT_S)
                if p.returncode == 0 and said.splitlines()[-1:] == ["ok"]:
                    self.by_helper = True
                    return out
            except (OSError, ValueError, subprocess.TimeoutExpired):
                _stop(p)
        self.by_helper = False
        req = json.loads(request)  # what the helper would have drawn from
        return draw(req["kind"], req["args"], out)

    def close(self) -> None:
        """No figure after all: the helper goes."""
        p, self.helper = self.helper, None
        if p is not None:
            _stop(p)


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)


@contextlib.contextmanager
def plotting(wanted: bool) -> Iterator[Plotter | None]:
    """A Plotter for a run that will draw its figure (its helper gone on the way out)."""
    if not wanted:
        yield None
        return
    plotter = Plotter()
    try:
        yield plotter
    finally:
        plotter.close()


def main() -> None:
    """The helper: matplotlib first, then one figure, as its stdin asks."""
    from oddl.app.experiments import figures

    figures.pyplot()
    line = sys.stdin.readline()
    if not line.strip():
        return  # the run ended without its figure
    req = json.loads(line)
    figures.draw(req["kind"], req["args"], Path(req["out"]))
    print("ok", flush=True)


if __name__ == "__main__":
    main()
