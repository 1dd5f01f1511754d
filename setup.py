"""The package list, found rather than written, and the compiled hot path.

Every folder of the design card installs under the one import name `oddl` (`controller/`
as `oddl.controller`, ...), and each of its sub-packages is discovered, so a new one can
never be left out of the wheel.

The hot modules (`HOT` in controller/base/compiled.py) are compiled with Cython from their
own .py files, which install beside the extensions. Where that cannot run (no C compiler,
no Python headers, `ODDL_BUILD_INTERPRETED=1`) the install still succeeds: one line says
the hot path runs interpreted.

Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

import os
import runpy
import sys
import time
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# the top-level folders and the names they install as (`oddl` itself is a namespace)
ROOTS = {
    "oddl.app": "app",
    "oddl.studies": "studies",
    "oddl.controller": "controller",
    "oddl.fpga": "fpga",
    "oddl.drivers": "drivers",
    "oddl.sim": "sim",
    "oddl.acceptance": "tests/acceptance",  # the hardware acceptance checks ship with oddl
}
HERE = os.path.dirname(os.path.abspath(__file__))
# the shipped testbeds and experiments: oddl/examples/ in the wheel (`oddl examples DIR`)
EXAMPLES = runpy.run_path(os.path.join(HERE, "app", "examples.py"))
COMPILED = runpy.run_path(os.path.join(HERE, "controller", "base", "compiled.py"))
SOURCES = {COMPILED["module_name"](p): p for p in COMPILED["HOT"] + COMPILED["KERNELS"]}


def discovered() -> list[str]:
    return [name for root, folder in ROOTS.items()
            for name in (root, *(f"{root}.{p}" for p in find_packages(folder)))]


def say(line: str) -> None:
    print(f"oddl: {line}", file=sys.stderr, flush=True)


class OptionalBuild(build_ext):
    """A failed compile leaves that module interpreted; the install goes on."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # one compiler a core: the build is most of an install
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all (distutils' platform error)
            say(f"the hot path runs interpreted: it could not be compiled ({e})")

    def build_extensions(self) -> None:
        self._done, self._t0 = 0, time.monotonic()
        say(f"compiling the hot path: {len(self.extensions)} modules, {self.parallel} at "
            f"a time (`pip install -v` shows this progress)")
        super().build_extensions()
        say(f"compiled the hot path in {time.monotonic() - self._t0:.0f} s")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # a compiler error, missing headers
            say(f"{ext.name} runs interpreted: it could not be compiled ({e})")
            return
        finally:
            self._done += 1  # (threads: the count is a progress line, not a tally)
            say(f"[{self._done}/{len(self.extensions)}] {ext.name} "
                f"({time.monotonic() - self._t0:.0f} s)")
        # what it was built from: a process runs the source instead once that changes
        built = self.get_ext_fullpath(ext.name)
        with open(built + COMPILED["STAMP"], "w") as f:
            f.write(COMPILED["digest"](SOURCES[ext.name]) + "\n")

    def copy_extensions_to_source(self) -> None:
        """An editable install: each extension, and its record, beside its source."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace, regular = self._get_inplace_equivalent(build_py, ext)
            if os.path.exists(regular + COMPILED["STAMP"]):
                self.copy_file(regular + COMPILED["STAMP"], inplace + COMPILED["STAMP"])


class WithExamples(build_py):
    """The wheel carries hw_configs/ and experiments/ as oddl/examples/ (an editable
    install reads them from the checkout)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for folder in EXAMPLES["FOLDERS"]:
            dest = os.path.join(self.build_lib, "oddl", "examples", folder)
            self.mkpath(dest)
            for name in sorted(os.listdir(os.path.join(HERE, folder))):
                if name.endswith(EXAMPLES["KINDS"]):
                    self.copy_file(os.path.join(HERE, folder, name), os.path.join(dest, name))


def extensions() -> list[Extension]:
    if os.environ.get("ODDL_BUILD_INTERPRETED", "") not in ("", "0"):
        say("the hot path runs interpreted (ODDL_BUILD_INTERPRETED is set)")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        say("the hot path runs interpreted: Cython is not installed")
        return []
    mods = [Extension(COMPILED["module_name"](p), [p]) for p in COMPILED["HOT"]]
    # the kernels transcribe numpy: floating point as numpy does it, so no a * b + c
    # contracted into one rounding
    mods += [Extension(COMPILED["module_name"](p), [p], extra_compile_args=["-ffp-contract=off"])
             for p in COMPILED["KERNELS"]]
    # Python's semantics throughout: annotations are not C types, so every value stays
    # the Python object it is interpreted (an int stays an int; the golden runs hold it)
    # (translated to C in parallel too, a process a core)
    return cythonize(mods, build_dir="build/cython", quiet=True, include_path=[typed()],
                     nthreads=os.cpu_count() or 1,
                     compiler_directives={"language_level": 3, "annotation_typing": False,
                                          "binding": True})


def typed() -> str:
    """The .pxd files that type a hot module (beside its .py) where Cython looks for them:
    under the module's import name (`oddl/sim/networks/electrical.pxd`), which is not
    the checkout's layout (`sim/networks/`). Returns that include directory."""
    top = Path("build", "pxd")
    for p in COMPILED["HOT"]:
        pxd = Path(HERE, p).with_suffix(".pxd")
        parts = COMPILED["module_name"](p).split(".")
        if not pxd.is_file():
            # one removed from the checkout: its copy would type the module still (and
            # fail its build): gone too, and the module compiled again
            stale = top.joinpath(*parts[:-1], parts[-1] + ".pxd")
            if stale.is_file():
                stale.unlink()
                Path("build", "cython", p).with_suffix(".c").unlink(missing_ok=True)
            continue
        for i in range(1, len(parts)):  # each package on the way, as Cython wants it
            top.joinpath(*parts[:i]).mkdir(parents=True, exist_ok=True)
            top.joinpath(*parts[:i], "__init__.pxd").touch()
        dest = top.joinpath(*parts[:-1], parts[-1] + ".pxd")
        text = pxd.read_bytes()
        if not dest.is_file() or dest.read_bytes() != text:
            dest.write_bytes(text)
            # cythonize's own check missed a .pxd new to the include path: compile again
            Path("build", "cython", p).with_suffix(".c").unlink(missing_ok=True)
    return str(top)


setup(packages=discovered(), package_dir=ROOTS, ext_modules=extensions(),
      cmdclass={"build_ext": OptionalBuild, "build_py": WithExamples})
