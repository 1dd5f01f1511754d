"""`oddl examples DIR` (issue 67): the shipped testbeds and experiments copied out, their
relative testbed paths intact, nothing of the user's overwritten. (The wheel's own copy is
held by test_packaging.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.api import check
from oddl.app.cli import main
from oddl.app.examples import shipped


def test_every_shipped_example_is_copied_and_checks_where_it_lands(root: Path,
                                                                   tmp_path: Path) -> None:
    ex = tmp_path / "ex"
    r = CliRunner().invoke(main, ["examples", str(ex)])
    assert r.exit_code == 0, r.output
    got = sorted(p.relative_to(ex) for p in ex.rglob("*") if p.is_file())
    assert got == shipped()
    for folder in ("hw_configs", "experiments"):  # every config and trace of the checkout
        assert {p.name for p in (ex / folder).iterdir()} == {
            p.name for p in (root / folder).iterdir()
            if p.suffix in (".toml", ".csv", ".py", ".json")}
    for f in sorted((ex / "experiments").glob("*.toml")) + sorted(
            (ex / "hw_configs").glob("*.toml")):
        assert check(f).startswith(f"OK {f}")  # their testbeds found beside them


def test_examples_overwrite_nothing(tmp_path: Path) -> None:
    mine = tmp_path / "experiments" / "table1-resnet50.toml"
    mine.parent.mkdir()
    mine.write_text("# edited\n")
    r = CliRunner().invoke(main, ["examples", str(tmp_path)])
    assert r.exit_code == 2
    assert r.output.strip() == f"error: {mine} already there: nothing copied (another " \
                               f"directory, or move those away)"
    assert mine.read_text() == "# edited\n"
    assert not (tmp_path / "hw_configs").exists()


@pytest.mark.parametrize("where", ["file", "folder"])
def test_examples_write_nothing_outside_dir(where: str, tmp_path: Path) -> None:
    """A symbolic link inside DIR, dangling or not, where a file or a folder goes: nothing
    is written through it (issue 85)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    d = tmp_path / "d"
    if where == "file":
        (d / "experiments").mkdir(parents=True)
        link = d / "experiments" / "table1-resnet50.toml"
        link.symlink_to(outside / "planted.toml")  # dangling
    else:
        d.mkdir()
        link = d / "hw_configs"
        link.symlink_to(outside)
    r = CliRunner().invoke(main, ["examples", str(d)])
    assert r.exit_code == 2, r.output
    assert f"{link} already there: nothing copied" in r.output
    assert list(outside.iterdir()) == []
