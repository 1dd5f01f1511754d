"""The suite's two lanes (tests/lanes.py): a module with a realtime test runs on a realtime
worker at the caller's priority, every other module on a batch worker that lowered its own
(before: four equal workers, and CI's realtime tests starved)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lanes import NICE

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import json, os
from pathlib import Path
import pytest

def where(name):
    out = Path(os.environ["LANES_OUT"]) / f"{name}.json"
    out.write_text(json.dumps([os.environ["PYTEST_XDIST_WORKER"], os.nice(0)]))
'''


@pytest.mark.realtime  # a pytest of its own, four workers
def test_realtime_modules_run_on_their_own_workers_and_the_rest_niced(tmp_path: Path
                                                                       ) -> None:
    d = tmp_path / "suite"
    d.mkdir()
    (d / "conftest.py").write_text(
        "from tests import lanes\n\n\ndef pytest_configure(config):\n"
        "    config.pluginmanager.register(lanes, 'oddl-lanes')\n")
    for i in range(3):
        (d / f"test_rt{i}.py").write_text(
            PROBE + f"\n@pytest.mark.realtime\ndef test_a():\n    where('rt{i}')\n\n\n"
            f"def test_b():\n    where('rt{i}b')\n")
        (d / f"test_batch{i}.py").write_text(PROBE + f"\ndef test_c():\n    where('batch{i}')\n")
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "4", "--dist",
                        "loadscope", "-p", "no:cacheprovider", "-o",
                        "markers=realtime: x", "--rootdir", str(d), str(d)],
                       cwd=d, capture_output=True, text=True, timeout=240,
                       env=os.environ | {"LANES_OUT": str(out), "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    seen = {f.stem: json.loads(f.read_text()) for f in out.glob("*.json")}
    assert len(seen) == 9
    mine = os.nice(0)
    for name, (worker, nice) in seen.items():
        if name.startswith("rt"):  # the whole module, its unmarked test too
            assert (worker in ("gw0", "gw1"), nice) == (True, mine), (name, worker, nice)
        else:
            assert (worker in ("gw2", "gw3"), nice) == (True, min(mine + NICE, 19)), (
                name, worker, nice)
