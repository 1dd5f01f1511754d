"""The public API as docs/api.md shows it: its worked example runs as written."""

from __future__ import annotations

import os
import re
from pathlib import Path


def test_docs_api_example_runs(root: Path) -> None:
    text = (root / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/api.md has no python example"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for block in blocks:
            exec(compile(block, "docs/api.md", "exec"), {"__name__": "docs_api"})
    finally:
        os.chdir(cwd)
