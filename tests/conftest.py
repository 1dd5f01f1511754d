from __future__ import annotations

import os
from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent

# One BLAS / OpenMP thread a process, here and in every process the suite starts: four
# workers share two cores, and OpenBLAS's threads spin while they wait for each other (the
# network's training took 65 s instead of 5 s beside two busy processes)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
threadpool_limits(1)  # the libraries already loaded


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


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
