"""The compiled hot path (issue 46): one source, compiled where it can be, chosen at import.

The golden runs hold the figures both ways (.ci/run runs tests/test_golden.py again with
ODDL_INTERPRETED=1); these hold which build a process runs."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from oddl.controller.base import compiled

WHICH = ("import json; from oddl.controller.base import compiled as c; import importlib; "
         "print(json.dumps({m: importlib.import_module(m).__file__ for m in c.HOT_MODULES}))")


def _files(**env: str) -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", WHICH], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120, check=True)
    return json.loads(r.stdout)


def test_the_hot_modules_run_compiled_where_they_were_built(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.INTERPRETED, raising=False)
    built = [p for p in compiled.HOT if compiled.extension_of(str(root / p))]
    if not built and not os.environ.get("ODDL_REQUIRE_COMPILED"):
        pytest.skip("this install was not compiled (.ci/run sets ODDL_REQUIRE_COMPILED, "
                    "where it must be)")
    assert len(built) == len(compiled.HOT), f"built: {built}"
    files = _files(ODDL_INTERPRETED="")
    assert all(not f.endswith(".py") for f in files.values()), files
    assert compiled.state() == f"hot path compiled ({len(compiled.HOT)} modules, Cython)"


def test_ODDL_INTERPRETED_runs_every_hot_module_from_its_source() -> None:
    files = _files(ODDL_INTERPRETED="1")
    assert sorted(files) == sorted(compiled.HOT_MODULES)
    assert all(f.endswith(".py") for f in files.values()), files


@pytest.fixture
def built_module(tmp_path: Path) -> tuple[Path, Path]:
    """A hot module's source and a build beside it (the finder decides from the files)."""
    source = tmp_path / "clock.py"
    source.write_text("X = 1\n")
    ext = tmp_path / f"clock{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"")
    return source, ext


def test_a_build_older_than_its_source_is_not_run(built_module: tuple[Path, Path],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """An editable install whose .py was edited after the build would run the old code."""
    monkeypatch.delenv(compiled.INTERPRETED, raising=False)
    source, ext = built_module
    finder = compiled._SourceFirst()
    os.utime(ext, (1_000, 1_000))
    os.utime(source, (2_000, 2_000))
    spec = finder.find_spec("oddl.sim.clock", [str(source.parent)])
    assert spec is not None and spec.origin == str(source)
    assert "older than its source" in caplog.text
    os.utime(ext, (3_000, 3_000))  # rebuilt: Python's own choice, the extension
    assert finder.find_spec("oddl.sim.clock", [str(source.parent)]) is None
    monkeypatch.setenv(compiled.INTERPRETED, "1")
    spec = finder.find_spec("oddl.sim.clock", [str(source.parent)])
    assert spec is not None and spec.origin == str(source)
    # a module that is not hot is never touched
    assert finder.find_spec("oddl.sim.emulate", [str(source.parent)]) is None
