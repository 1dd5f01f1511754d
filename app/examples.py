"""The shipped testbeds and experiments (`hw_configs/`, `experiments/`), for `oddl
examples DIR`: a wheel installs them as `oddl/examples/` (setup.py), a checkout holds them
as its own folders. The copy keeps the two folders side by side, so an experiment's
`testbed = "../hw_configs/..."` still names its testbed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FOLDERS = ("hw_configs", "experiments")
KINDS = (".toml", ".csv", ".py", ".json")  # configs, job and profiler traces, scripts


class NoExamples(RuntimeError):
    """This install holds no examples (a wheel built without them)."""


def source() -> Path:
    """Where this install's examples are: the wheel's `oddl/examples/`, else the
    checkout an editable install runs from."""
    top = Path(__file__).resolve().parent.parent  # a wheel's oddl/, or the checkout
    for root in (top / "examples", top):
        if all((root / f).is_dir() for f in FOLDERS):
            return root
    raise NoExamples(f"this install of oddl holds no examples (looked in {top / 'examples'} "
                     f"and {top})")


def shipped(root: Path | None = None) -> list[Path]:
    """The example files, relative to their root (hw_configs/..., experiments/...)."""
    root = root or source()
    return sorted(p.relative_to(root) for f in FOLDERS for p in (root / f).iterdir()
                  if p.is_file() and p.suffix in KINDS)


def copy_to(dest: Path) -> list[Path]:
    """Every example copied under `dest`; FileExistsError, with nothing copied, if one
    would overwrite a file there (an edited testbed is the user's)."""
    root = source()
    files = shipped(root)
    # a symbolic link where a file or folder goes (dangling or not) would take the copy
    # outside DIR: it counts as there
    links = [dest / d for d in FOLDERS if (dest / d).is_symlink()]
    there = links or [dest / f for f in files if (dest / f).exists() or
                      (dest / f).is_symlink()]
    if there:
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        raise FileExistsError(f"{there[0]}{more} already there: nothing copied (another "
                              f"directory, or move those away)")
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        # created here or not at all: never through a link made meanwhile
        fd = os.open(dest / f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out, (root / f).open("rb") as src:
            shutil.copyfileobj(src, out)
    return [dest / f for f in files]
