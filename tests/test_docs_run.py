"""The docs tier (issue 83): every shell block of README.md and docs/*.md runs as written,
or says why not. `python -m pytest -q -n 0 --docs -m docs` (.ci/run) runs each block with
bash, `set -e`, in a folder of its own holding `oddl examples` (the paths the docs name),
as a reader pastes it: the block fails at its first command that fails.

- A block that does not run says so on the line before it, with the reason:
  `<!-- not run: a lab's boards (lab.toml) -->`. The suite holds every block to either
  (`test_every_block_runs_or_says_why_not`).
- `pip install ...` is the install this tier runs in: it is not run again (the packaging
  test installs the wheel in a fresh venv and runs its commands from another folder).
- A command documented to fail says with what, in its comment: `# exits 1: ...`.
- What a block starts in the background (`&`) is stopped (SIGTERM) when the block ends.

Reproducers: docs/arbiter.md submitted a `job.toml` that does not ship, README's
`oddl gateware verilog [--top]` needed `--out`: the parse test catches the second; only
running catches the first."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]+?) -->\n)?```(?P<lang>bash|sh|console)\n"
                   r"(?P<body>.*?)```", re.S)
EXITS = re.compile(r"^(?P<cmd>.*?)\s+# exits (?P<rc>\d+)\b.*$")
BLOCK_S = 900  # the longest block: an FPGA synthesis, or an emulated lab's jobs


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    body: str
    why: str  # not run, and why ("" runs)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("body"))
            out.append(Block(page.relative_to(ROOT).as_posix(), line, m["body"],
                             " ".join((m["why"] or "").split())))
    return out


def script(body: str) -> str:
    """The block as bash runs it: pip's installs are this tier's own, a documented exit
    is held to, and the background is stopped at the end."""
    lines = ["set -e", "trap 'rc=$?; kill $(jobs -p) 2>/dev/null || true; wait; exit $rc' EXIT"]
    for line in body.splitlines():
        line = re.sub(r"\bpip install [^&;|#\n]*", "true ", line)
        if m := EXITS.match(line):
            line = (f"if {m['cmd']}; then echo 'documented to exit {m['rc']}' >&2; false; "
                    f"else test $? -eq {m['rc']}; fi")
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_every_block_runs_or_says_why_not() -> None:
    """Each block runs in the docs tier unless marked; a mark names its reason."""
    found = blocks()
    assert len(found) >= 15, [str(b) for b in found]
    for b in found:
        assert b.why or b.body.strip(), b
    assert [str(b) for b in found if b.why and len(b.why) < 8] == []  # a reason, not "no"
    # the rewriting a reader would not notice, held to
    s = script("pip install -e . && oddl run x.toml\noddl accept tb --fault f  # exits 1: ok")
    assert "true && oddl run x.toml" in s
    assert "if oddl accept tb --fault f; then" in s and "test $? -eq 1" in s


@pytest.mark.docs
@pytest.mark.realtime
@pytest.mark.parametrize("block", blocks(), ids=str)
def test_a_documented_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.why:
        pytest.skip(f"not run: {block.why}")
    subprocess.run([sys.executable, "-m", "oddl.app", "examples", str(tmp_path)], check=True,
                   capture_output=True, timeout=60)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ODDL_")} | {
        "ODDL_LOCK_DIR": os.environ.get("ODDL_LOCK_DIR", str(tmp_path / "locks"))}
    bindir = str(Path(sys.executable).parent)  # the `oddl` of this interpreter
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    p = subprocess.Popen(["bash", "-c", script(block.body)], cwd=tmp_path, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)
    try:
        out, err = p.communicate(timeout=BLOCK_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # whatever it left behind
    said = "\n".join(line for line in err.splitlines()  # (the services' logs aside)
                     if not re.search(r" (INFO|WARNING) oddl\.", line))
    assert p.returncode == 0, (f"{block}: exit {p.returncode}\n--- stdout\n{out[-3000:]}"
                               f"\n--- stderr\n{said[-3000:]}")
