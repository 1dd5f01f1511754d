"""The compiled hot path: which modules are compiled, and which build runs.

The modules in `HOT` are what a simulated flow runs through: the event loop, the board and
its count-action engine, the register model, the bus and the fabric, the driver's per-flow
path, the control unit, the collective's steps, a job's deliveries and their checks, the
health watch; the schedules and the planner; and on the baselines' networks, the flow
solver, the topologies and the congestion laws. setup.py compiles each
of them with Cython (docs/performance.md) from the very same .py file that runs
interpreted, and installs the extension beside it, so the code a lab runs on a board and
the code a simulation runs are one source.

Python prefers an extension to the source beside it. `install()` puts a finder in front of
that choice, for oddl's modules only, so that:
- `ODDL_INTERPRETED=1` runs every module from its source (CI runs the golden tests both
  ways; a profile of the interpreted path);
- an extension built from other source than the one beside it (an editable install whose
  .py was edited since the build) is not run: the source is, and a warning says to rebuild
  (`pip install -e .`).

This module imports only the standard library: setup.py reads `HOT` from it before oddl
is installed.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

log = logging.getLogger(__name__)

# the compiled modules, as source paths of this checkout (setup.py's ROOTS map the folders)
HOT = (
    "sim/clock.py",
    "sim/devices/onic_board.py",
    "sim/devices/pynq_device.py",
    "sim/devices/bus.py",
    "sim/devices/fabric.py",
    "drivers/onic.py",
    "controller/stage2/control_unit.py",
    "controller/stage2/workloads.py",
    "controller/service/health.py",
    "controller/base/collectives.py",  # the schedules, and stage 1's plan of them
    "controller/stage1/planner.py",
    "controller/stage1/plan.py",
    "controller/stage2/job.py",  # a job's flows delivered, and checked
    "controller/stage2/invariants.py",
    "sim/networks/electrical.py",  # the flow networks: the solver, the topologies, the laws
    "sim/networks/sharing.py",
    "sim/networks/congestion.py",
    "sim/networks/fattree.py",
    "sim/networks/sipring.py",
    "sim/networks/baselines.py",
)
# kernels written for Cython (.pyx) beside the Python they transcribe, held equal to it
KERNELS = ("sim/networks/lawkernel.pyx", "sim/networks/fillkernel.pyx")
INTERPRETED = "ODDL_INTERPRETED"  # set to 1: run every module from its source


def module_name(path: str) -> str:
    """`sim/clock.py` (or .pyx) -> `oddl.sim.clock`."""
    return "oddl." + path.rpartition(".")[0].replace("/", ".")


HOT_MODULES = tuple(module_name(p) for p in HOT)
KERNEL_MODULES = tuple(module_name(p) for p in KERNELS)


def interpreted_by_choice() -> bool:
    return os.environ.get(INTERPRETED, "") not in ("", "0")


def extension_of(source: str) -> str | None:
    """The built extension beside a source file (.py or .pyx), if there is one."""
    stem = source.rpartition(".")[0]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.isfile(stem + suffix):
            return stem + suffix
    return None


def digest(source: str) -> str:
    """What a build records of the source it compiled (setup.py writes it to `STAMP`):
    the .py, and the .pxd beside it that types it where there is one (a wheel carries
    both)."""
    pxd = source.rpartition(".")[0] + ".pxd"
    h = hashlib.sha256()
    for path in (source, pxd) if os.path.isfile(pxd) else (source,):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


STAMP = ".source-sha256"  # beside an extension: the digest of the source it was built from


def _stale(ext: str, source: str) -> bool:
    """Built from other source than the one beside it (a wheel ships no .pyx: a kernel's
    build is never stale there). By content, not time: installing a wheel gives every
    file a new time."""
    if not os.path.isfile(source):
        return False
    try:
        with open(ext + STAMP) as f:
            return f.read().strip() != digest(source)
    except OSError:
        return True  # no record of what it was built from


class _NotBuilt(importlib.abc.Loader):
    """A kernel not to be run: its import fails, and its user takes the Python it
    transcribes."""

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        raise ImportError(f"{spec.name}: not run ({spec.origin})", name=spec.name)

    def exec_module(self, module: ModuleType) -> None:  # never reached
        raise ImportError(module.__name__)


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Runs a hot module from its source, and refuses a kernel, when asked to
    (ODDL_INTERPRETED) or when the build was made from other source."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        kernel = name in KERNEL_MODULES
        if not (kernel or name in HOT_MODULES) or not path:
            return None  # everything else: Python's own finders, untouched
        leaf = name.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, leaf + (".pyx" if kernel else ".py"))
            ext = extension_of(source)
            if ext is None:
                continue  # not built (or not here): Python's finders decide
            if not interpreted_by_choice():
                if not _stale(ext, source):
                    return None  # the extension, as Python would choose it
                log.warning("%s: its source changed since it was compiled, and runs "
                            "instead (rebuild: pip install -e .)", name)
            if kernel:
                return ModuleSpec(name, _NotBuilt(), origin=ext)
            return importlib.util.spec_from_file_location(name, source)
        return None


_finder = _SourceFirst()


def install() -> None:
    """Put the finder first, once (each top-level package that holds a hot module calls
    this before any of its modules is imported)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def state() -> str:
    """One line: how the hot path runs in this process, and why."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    built = stale = 0
    for path in HOT + KERNELS:
        source = os.path.join(root, path)
        ext = extension_of(source)
        if ext is not None:
            built += 1
            stale += _stale(ext, source)
    whole = len(HOT) + len(KERNELS)
    if built == 0:
        return ("hot path interpreted: it was not compiled at install (a C compiler and the "
                "Python headers build it: pip install -e .)")
    if interpreted_by_choice():
        return f"hot path interpreted ({INTERPRETED} is set)"
    if stale or built < whole:
        return (f"hot path partly compiled: {built - stale} of {whole} modules; the rest "
                "changed since the build or were not built (rebuild: pip install -e .)")
    return f"hot path compiled ({built} modules, Cython)"
