"""pynq, as a command imports it: without IPython, which no command's process shows.

pynq imports IPython for notebooks only (pynqmetadata's visualisations take
`IPython.display`; pynqutils' board store takes `tqdm.notebook`, which takes the widgets),
and IPython's import is most of pynq's: 0.33 s of CPU and 22 MB a process that opens a
board (`oddl run --backend emu|hw`, `emulate`, `arbiter`, `node`, `accept`; farm-bench, 8
runs each way). A command's process imports pynq with stand-ins for those two names: a
`display`, `HTML` or `Javascript` called later is IPython's own, imported then. Where IPython
is already loaded (the API in a notebook), or pynq asks for more of it, pynq is imported as
it is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_STANDING_IN = ("IPython", "IPython.display", "IPython.html")


def _deferred(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:  # IPython's own, if it is ever asked for
        return getattr(importlib.import_module("IPython.display"), name)(*args, **kwargs)

    call.__name__ = name
    return call


def _stand_in() -> None:
    package = ModuleType("IPython")
    package.__path__ = []  # a package whose other modules are not there
    display = ModuleType("IPython.display")
    for name in ("display", "HTML", "Javascript"):
        setattr(display, name, _deferred(name))
    sys.modules.update({"IPython": package, "IPython.display": display})
    # None: `import IPython.html.widgets` fails (tqdm.notebook then has no widgets)
    sys.modules["IPython.html"] = None  # type: ignore[assignment]


def _stand_down() -> None:
    for name in _STANDING_IN:
        sys.modules.pop(name, None)


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        _stand_in()
        try:
            self.real.exec_module(module)
            return
        except ImportError as e:
            if not (e.name or "").startswith("IPython"):
                raise
            # a pynq that wants more of IPython: what it imported goes, and it is imported
            # again with the real one
            for name in [m for m in sys.modules if m.partition(".")[0] in
                         ("pynq", "pynqutils", "pynqmetadata") and m != "pynq"]:
                del sys.modules[name]
            sys.modules.pop("tqdm.notebook", None)
        finally:
            _stand_down()
        self.real.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Takes pynq's first import, once."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pynq":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or "IPython" in sys.modules:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """pynq's first import in this process, whenever it comes, without IPython."""
    if "pynq" not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
