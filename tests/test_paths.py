"""The docs and the code's comments name modules that exist (issue 45: nine references to
paths from before a restructuring, `controller.devices` and `sim/invariants.py` among
them, survived it; issue 67: a name without `oddl.`, such as `controller.devices`, was
not checked at all)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "controller", "sim", "studies", "drivers", "fpga", "tests", "bench",
           "experiments", "hw_configs", "docs")
# a path of ours (folder/.../name.ext) or a dotted module of ours (oddl.part.module)
FOLDER = "|".join(FOLDERS)
PATH = re.compile(rf"(?<![\w./-])((?:{FOLDER})/[\w./-]*\w\."
                  r"(?:py|md|toml|tcl|json|js|html|css|hwh|ca|csv))\b")
MODULE = re.compile(r"(?<![\w.])(oddl\.(?:app|controller|sim|studies|drivers|fpga|acceptance)"
                    r"(?:\.[a-z_][a-z0-9_]*)*)")
# a module named in backticks without `oddl.`, from its folder (`controller.devices`) or
# from its part (`service.admission`, as a docstring inside controller/ names it)
TOPS = ("app", "controller", "sim", "studies", "drivers", "fpga")
PARTS_OF = {"cli": "app", "experiments": "app", "base": "controller", "stage1": "controller",
            "stage2": "controller", "service": "controller", "serving": "controller",
            "devices": "sim", "networks": "sim", "gateware": "fpga"}
SHORT = re.compile(rf"`((?:{'|'.join((*TOPS, *PARTS_OF))})(?:\.[a-z_][a-z0-9_]*)+)`")
TEXTS = [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"),
         *(p for f in FOLDERS if f != "docs" for p in (ROOT / f).rglob("*")
           if p.suffix in (".py", ".js", ".toml", ".tcl", ".html") and "__pycache__"
           not in p.parts and p != Path(__file__).resolve())]


def _module_exists(name: str) -> bool:
    """A module, a package, or an attribute of one (oddl.app.api.run): the longest prefix
    that is a module must hold the rest (`oddl.controller.devices` is not
    `oddl.controller`)."""
    parts = name.split(".")
    for k in range(len(parts), 1, -1):
        try:
            if importlib.util.find_spec(".".join(parts[:k])) is None:
                continue
        except (ModuleNotFoundError, ValueError):
            continue
        obj: object = importlib.import_module(".".join(parts[:k]))
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_path_and_module_named_exists() -> None:
    stale = []
    for f in TEXTS:
        text = f.read_text(errors="replace")
        for m in PATH.finditer(text):
            p = m.group(1).rstrip(".")
            if not (ROOT / p).exists() and not any(x in p for x in ("*", "{", "<", "NAME")):
                stale.append(f"{f.relative_to(ROOT)}: {p}")
        for m in MODULE.finditer(text):
            name = m.group(1).rstrip(".")
            if name != "oddl" and not _module_exists(name):
                stale.append(f"{f.relative_to(ROOT)}: {name}")
        for m in SHORT.finditer(text):
            name = m.group(1)
            top = name.split(".")[0]
            full = f"oddl.{name}" if top in TOPS else f"oddl.{PARTS_OF[top]}.{name}"
            if not _module_exists(full):
                stale.append(f"{f.relative_to(ROOT)}: {name}")
    assert stale == [], "\n".join(sorted(set(stale)))


PARTS = ["app", "app/cli", "app/experiments", "controller", "controller/base",
         "controller/stage1", "controller/stage2", "controller/service", "controller/serving",
         "sim", "sim/devices", "sim/networks", "studies", "drivers", "fpga", "fpga/gateware"]


def test_every_part_says_what_it_holds() -> None:
    """Each part's docstring names each of its modules and sub-parts (issue 45: three
    omitted the modules they held)."""
    import ast

    missing = []
    for part in PARTS:
        d = ROOT / part
        doc = ast.get_docstring(ast.parse((d / "__init__.py").read_text())) or ""
        held = [p.stem for p in d.glob("*.py") if not p.stem.startswith("__")
                ] + [p.name for p in d.iterdir() if (p / "__init__.py").exists()]
        missing += [f"{part}: {m}" for m in held if f"`{m}" not in doc]
    assert missing == [], missing
