"""The wheel, as a user installs it (issue 43). Reproducer: the wheel's `oddl` did not
start ("No module named 'oddl.app.cli'"): the package list was written by
hand and left the entry point's package out; editable installs hid it.

The wheel is built from this checkout and installed into a fresh venv; its dependencies
come from this interpreter's site-packages through a path file (a path, not a site
directory: their own .pth files, this checkout's editable install among them, are not
run), so that only the wheel provides `oddl`. Every command runs from `/`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
from oddl.controller import __version__ as oddl_version

pytestmark = pytest.mark.realtime  # a build, a venv, subprocesses


@pytest.fixture(scope="module")
def wheel_venv(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheel")
    # built without its compiled hot path: the install a machine with no C compiler gets
    # (and a minute less of the suite); the editable install the suite runs is compiled
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(d / "dist"), str(root)], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "ODDL_BUILD_INTERPRETED": "1"})
    (whl,) = (d / "dist").glob("oddl-*.whl")
    env = d / "venv"
    venv.create(env, with_pip=False)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env),
                                                     "platbase": str(env)}))
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"),
                    "install", "--no-deps", "-q", str(whl)], check=True, capture_output=True,
                   timeout=300)
    with zipfile.ZipFile(whl) as z:  # the shipped data the commands need
        names = set(z.namelist())
    assert {"oddl/app/cli/main.py", "oddl/fpga/overlays/oddl_onic.hwh",
            "oddl/app/web/index.html", "oddl/acceptance/plugin.py",
            "oddl/examples/experiments/table1-resnet50.toml",
            "oddl/examples/hw_configs/prototype-4node.toml",
            "oddl/controller/py.typed", "oddl/drivers/py.typed", "oddl/app/py.typed"} <= names
    return env


def _oddl(env: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(env / "bin" / "oddl"), *args], cwd="/", capture_output=True,
                          text=True, timeout=timeout)


def test_the_wheel_alone_runs_its_commands_from_anywhere(root: Path, tmp_path: Path,
                                                         wheel_venv: Path) -> None:
    where = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                            "import oddl.controller, oddl.sim; print(oddl.controller.__file__, "
                            "oddl.sim.__file__)"], cwd="/", capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert all(p.startswith(str(wheel_venv)) for p in where.stdout.split()), where.stdout
    r = _oddl(wheel_venv, "--help")
    assert r.returncode == 0 and "oddl: the ODDL optical interconnect" in r.stdout, r.stderr
    r = _oddl(wheel_venv, "--version")
    assert r.stdout.startswith(f"oddl {oddl_version}; hot path interpreted: it was not "
                               "compiled"), r
    # the shipped testbeds and experiments, copied out of the wheel (issue 67): a wheel
    # user has no checkout
    ex = tmp_path / "ex"
    r = _oddl(wheel_venv, "examples", str(ex))
    assert r.returncode == 0 and f"try: oddl run {ex}/experiments/table1" in r.stdout, r
    assert sorted(p.name for p in (ex / "hw_configs").iterdir()) == sorted(
        p.name for p in (root / "hw_configs").glob("*.toml"))
    (ex / "hw_configs" / "grid-64.toml").write_text("# mine\n")
    r = _oddl(wheel_venv, "examples", str(ex))  # nothing of the user's overwritten
    assert r.returncode == 2 and "already there: nothing copied" in r.stderr, r
    assert (ex / "hw_configs" / "grid-64.toml").read_text() == "# mine\n"
    r = _oddl(wheel_venv, "check", str(ex / "hw_configs" / "prototype-4node.toml"))
    assert r.returncode == 0 and r.stdout.startswith("OK "), r.stderr
    # every check but the control bus's round trip, which a loaded machine (the suite's,
    # in parallel) fails as it should: its 5 ms bound is a lab's
    checks = [arg for c in ("reachable", "identity", "registers", "tuning", "routes",
                            "loopback", "countaction") for arg in ("--only", c)]
    r = _oddl(wheel_venv, "accept", str(ex / "hw_configs" / "prototype-4node.toml"),
              "--backend", "emu", "--report", str(tmp_path / "accept"), *checks)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((tmp_path / "accept" / "summary.json").read_text())
    assert summary["verdict"] == "PASS" and summary["counts"]["failed"] == 0
    r = _oddl(wheel_venv, "run", str(ex / "experiments" / "table1-resnet50.toml"),
              "--iterations", "500", "--json", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: hot path interpreted: it was not compiled" in r.stderr  # said once, and why
    oddl = json.loads(r.stdout)["networks"]["oddl"]
    assert oddl["iterations"] == 500 and oddl["invariant_violations"] == 0
    r = _oddl(wheel_venv, "lightning", "mac", "100x50", "20x30", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert abs(json.loads(r.stdout)["decoded"] - (100 * 50 + 20 * 30) / 256) < 1.0
    r = _oddl(wheel_venv, "optinc", "onn", "--samples", "1000", "--json")  # its data file
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["onn"]["exact_share_ideal_chip"] >= 0.99


def test_a_missing_extra_is_named_by_the_wheels_oddl(wheel_venv: Path) -> None:
    """Without the gateware extra (Amaranth hidden: None in sys.modules makes its import
    fail as if it were not installed), `oddl gateware synth` names the extra, exit 2."""
    r = subprocess.run([str(wheel_venv / "bin" / "python"), "-c",
                        "import sys; sys.modules['amaranth'] = None; sys.argv = ['oddl', "
                        "'gateware', 'synth']; from oddl.app.cli.main import "
                        "entry; entry()"], cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ('error: oddl gateware needs the O-NIC gateware (Amaranth HDL, '
                                'Yosys, nextpnr-ecp5 and ecppack from PyPI), which is not '
                                'installed: pip install "oddl[gateware]"')


def test_the_sdist_holds_every_source_the_hot_path_is_built_from(root: Path,
                                                                  tmp_path: Path) -> None:
    """Reproducer: the sdist had neither kernel's .pyx, and no wheel could be built from
    it ("'sim/networks/lawkernel.pyx' doesn't match any files"). It holds each compiled
    module's .py, each kernel's .pyx and each .pxd that types a module, whatever the
    machine that made it could compile (here: nothing)."""
    from oddl.controller.base import compiled

    subprocess.run([sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path / "dist"),
                    str(root)], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "ODDL_BUILD_INTERPRETED": "1"})
    (sdist,) = (tmp_path / "dist").glob("oddl-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    typing = [str(Path(p).with_suffix(".pxd")) for p in compiled.HOT
              if (root / p).with_suffix(".pxd").is_file()]
    assert typing  # (sim/networks/electrical.pxd, at least)
    missing = {*compiled.HOT, *compiled.KERNELS, *typing} - names
    assert not missing, missing


def test_the_version_is_one_everywhere(root: Path) -> None:
    """`oddl --version` (the installed metadata), the package's `__version__` and the
    changelog's newest release say the same version (issue 87)."""
    import re
    from importlib.metadata import version

    import oddl.controller

    newest = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (root / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None
    assert version("oddl") == oddl.controller.__version__ == newest.group(1)
