"""The compiled hot path (issue 46): one source, compiled where it can be, chosen at import.

The golden runs hold the figures both ways (.ci/run runs tests/test_golden.py again with
ODDL_INTERPRETED=1); these hold which build a process runs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from oddl.controller.base import compiled

WHICH = """
import importlib, json
from oddl.controller.base import compiled as c
from oddl.sim.networks import congestion, electrical
print(json.dumps({"hot": {m: importlib.import_module(m).__file__ for m in c.HOT_MODULES},
                  "kernels": [congestion.lawkernel is not None,
                              electrical.fillkernel is not None]}))
"""


def _files(**env: str) -> tuple[dict[str, str], list[bool]]:
    """Each hot module's file, and whether each kernel runs, in a fresh process."""
    r = subprocess.run([sys.executable, "-c", WHICH], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120, check=True)
    out = json.loads(r.stdout)
    return out["hot"], out["kernels"]


def test_the_hot_modules_run_compiled_where_they_were_built(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.INTERPRETED, raising=False)
    every = compiled.HOT + compiled.KERNELS
    built = [p for p in every if compiled.extension_of(str(root / p))]
    if not built and not os.environ.get("ODDL_REQUIRE_COMPILED"):
        pytest.skip("this install was not compiled (.ci/run sets ODDL_REQUIRE_COMPILED, "
                    "where it must be)")
    assert len(built) == len(every), f"built: {built}"
    files, kernels = _files(ODDL_INTERPRETED="")
    assert all(not f.endswith(".py") for f in files.values()), files
    assert kernels == [True, True]
    assert compiled.state() == f"hot path compiled ({len(every)} modules, Cython)"


def test_ODDL_INTERPRETED_runs_every_hot_module_from_its_source() -> None:
    files, kernels = _files(ODDL_INTERPRETED="1")
    assert sorted(files) == sorted(compiled.HOT_MODULES)
    assert all(f.endswith(".py") for f in files.values()), files
    assert kernels == [False, False]  # numpy's tick and solver, which they transcribe


@pytest.fixture
def built_module(tmp_path: Path) -> tuple[Path, Path]:
    """A hot module's source and a build beside it (the finder decides from the files)."""
    source = tmp_path / "clock.py"
    source.write_text("X = 1\n")
    ext = tmp_path / f"clock{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"")
    return source, ext


def test_a_build_of_other_source_is_not_run(built_module: tuple[Path, Path],
                                           monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """An editable install whose .py was edited after the build would run the old code.
    Decided by content: a wheel's install gives every file a new time, in no order."""
    monkeypatch.delenv(compiled.INTERPRETED, raising=False)
    source, ext = built_module
    stamp = Path(str(ext) + compiled.STAMP)
    stamp.write_text(compiled.digest(str(source)) + "\n")
    finder = compiled._SourceFirst()
    os.utime(ext, (1_000, 1_000))  # older than its source, as after a wheel's install
    assert finder.find_spec("oddl.sim.clock", [str(source.parent)]) is None  # the build
    source.write_text("X = 2\n")  # edited since the build
    spec = finder.find_spec("oddl.sim.clock", [str(source.parent)])
    assert spec is not None and spec.origin == str(source)
    assert "its source changed since it was compiled" in caplog.text
    stamp.write_text(compiled.digest(str(source)))  # rebuilt
    assert finder.find_spec("oddl.sim.clock", [str(source.parent)]) is None
    stamp.unlink()  # no record of what it was built from: the source
    assert finder.find_spec("oddl.sim.clock", [str(source.parent)]) is not None
    stamp.write_text(compiled.digest(str(source)))
    monkeypatch.setenv(compiled.INTERPRETED, "1")
    spec = finder.find_spec("oddl.sim.clock", [str(source.parent)])
    assert spec is not None and spec.origin == str(source)
    # a module that is not hot is never touched
    assert finder.find_spec("oddl.sim.emulate", [str(source.parent)]) is None


def test_a_build_typed_by_another_pxd_is_not_run(built_module: tuple[Path, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A .pxd beside the .py types its build (issue 66: sim/networks/electrical.pxd):
    the build's record covers it, so a .pxd edited, added or removed since the build
    runs the source, as an edited .py does."""
    monkeypatch.delenv(compiled.INTERPRETED, raising=False)
    source, ext = built_module
    pxd = source.with_suffix(".pxd")
    pxd.write_text("cdef class A:\n    cdef public double x\n")
    stamp = Path(str(ext) + compiled.STAMP)
    stamp.write_text(compiled.digest(str(source)))
    finder = compiled._SourceFirst()
    assert finder.find_spec("oddl.sim.clock", [str(source.parent)]) is None  # the build
    pxd.write_text("cdef class A:\n    cdef public object x\n")  # retyped since
    spec = finder.find_spec("oddl.sim.clock", [str(source.parent)])
    assert spec is not None and spec.origin == str(source)
    stamp.write_text(compiled.digest(str(source)))  # rebuilt
    assert finder.find_spec("oddl.sim.clock", [str(source.parent)]) is None
    pxd.unlink()  # built typed, the .pxd gone: not the build of this source
    spec = finder.find_spec("oddl.sim.clock", [str(source.parent)])
    assert spec is not None and spec.origin == str(source)


def test_a_kernel_of_other_source_is_refused(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale kernel is not imported at all: its user runs the numpy it transcribes."""
    monkeypatch.delenv(compiled.INTERPRETED, raising=False)
    source = tmp_path / "lawkernel.pyx"
    source.write_text("")
    ext = tmp_path / f"lawkernel{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"")
    Path(str(ext) + compiled.STAMP).write_text("0" * 64)  # built from other source
    finder = compiled._SourceFirst()
    spec = finder.find_spec("oddl.sim.networks.lawkernel", [str(tmp_path)])
    assert spec is not None and spec.loader is not None
    with pytest.raises(ImportError, match="not run"):
        importlib.util.module_from_spec(spec)
    source.unlink()  # a wheel: no source beside it, so never stale
    assert finder.find_spec("oddl.sim.networks.lawkernel", [str(tmp_path)]) is None
