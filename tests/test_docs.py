"""The documented commands are the CLI's (issue 83): every `oddl ...` in README.md and
docs/*.md, in a shell block or named in the prose, is held to the commands and options
`oddl` has. A shell block's command is whole: its options that take a value have one, its
required options are there. A synopsis (`oddl cmd [--opt X]`) is held the same way; a
mention in a sentence (`oddl run --trace`) only names a command and its options.

Reproducers: README's `oddl gateware verilog [--top]` (which needs --out, and whose --top
takes a value) and `oddl usage [--since] [--until]`."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from oddl.app.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def documented(text: str) -> list[tuple[str, bool]]:
    """(command, whole): each `oddl ...` of a shell block (whole), then of the prose."""
    out = []
    blocks = re.compile(r"```(bash|sh|console|text)?\n(.*?)```", re.S)
    for m in blocks.finditer(text):
        for line in m.group(2).splitlines():
            for part in re.split(r"&&|\|\||;|\|(?=\s)", line):
                part = part.split("#")[0].strip().rstrip("&").strip()
                part = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", part)  # VAR=value oddl ...
                if part.startswith("oddl "):  # a text block's: a synopsis
                    out.append((part, m.group(1) != "text"))
    out += [(m.group(1), False) for m in re.finditer(r"`(oddl [^`]+)`", blocks.sub("", text))]
    return out


def _tokens(command: str) -> list[str]:
    s = re.sub(r"[\[\]]", " ", command).replace("\\|", "|").replace("...", " ")
    try:
        return shlex.split(s)
    except ValueError:
        return s.split()


def problems(command: str, whole: bool) -> list[str]:
    """What in `command` the CLI does not have (empty: it parses as oddl's)."""
    toks = _tokens(command)
    cmds: list[click.Command] = [main]
    i = 1
    while i < len(toks) and all(isinstance(c, click.Group) for c in cmds):
        alts = re.split(r"[|/]", toks[i])  # `check|compile`, `run/emulate`
        if toks[i].startswith("-") or not all(_NAME.match(a) for a in alts):
            break
        found = [c.commands[a] for c in cmds if isinstance(c, click.Group)
                 for a in alts if a in c.commands]
        if not found:
            return [f"no command {toks[i]!r}"]
        cmds, i = found, i + 1
    options = {n: p for c in cmds for p in c.params
               for n in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
    synopsis = whole or "[" in command
    out = []
    rest = toks[i:]
    for k, t in enumerate(rest):
        for alt in t.split("|"):
            for name in alt.split("/") if alt.startswith("--") else [alt]:
                name = name.split("=")[0]
                if not name.startswith("-") or re.match(r"^-\d", name) or name == "--help":
                    continue
                p = options.get(name)
                if p is None:
                    out.append(f"no option {name}")
                    continue
                if isinstance(p, click.Option) and not p.is_flag and "=" not in alt \
                        and len(cmds) == 1 and synopsis:
                    bare = re.search(r"\[" + re.escape(name) + r"\]", command)
                    nxt = rest[k + 1] if k + 1 < len(rest) else None
                    if bare or (whole and (nxt is None or nxt.startswith("-"))):
                        out.append(f"{name} takes a value")
    if synopsis and len(cmds) == 1 and "..." not in command:
        out += [f"{p.opts[0]} is required" for p in cmds[0].params
                if isinstance(p, click.Option) and p.required and not p.envvar
                and not any(o in toks for o in p.opts)]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_documented_command_is_the_clis(page: Path) -> None:
    bad = [f"{c!r}: {'; '.join(why)}" for c, whole in documented(page.read_text())
           if (why := problems(c, whole))]
    assert not bad, "\n".join(bad)


def test_a_command_that_no_longer_parses_is_caught() -> None:
    assert problems("oddl gateware verilog [--top]", False) == [
        "--top takes a value", "--out is required"]
    assert problems("oddl usage --since", True) == ["--since takes a value"]
    assert problems("oddl run EXP --no-such", False) == ["no option --no-such"]
    assert problems("oddl frobnicate", False) == ["no command 'frobnicate'"]
    assert problems("oddl countaction check|compile [--param N=V] [--testbed TB]", False) == []
    assert problems("oddl gateware verilog --out DIR [--top onic_top]", False) == []
