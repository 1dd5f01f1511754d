"""A command's process imports pynq without IPython (app/cli/notebookless.py), and IPython
is still there for whoever asks for it. Each case in a fresh interpreter: the suite's
workers have long imported both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

INSTALLED = "from oddl.app.cli import notebookless; notebookless.install()\n"


def _python(code: str, *, path: Path | None = None) -> str:
    env = os.environ if path is None else {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_a_command_opens_boards_with_pynq_and_no_ipython() -> None:
    out = _python(INSTALLED + """
import sys
import pynq
from pynq.pl_server.remote_device import RemoteDevice
from oddl.sim import backend
print(sorted(m for m in sys.modules if m.startswith("IPython")))
from IPython.display import HTML  # IPython's own, when asked for
import pynqmetadata.frontends.visualisations.metadata_vis as vis
print(type(HTML("x")).__module__, type(vis.HTML("x")).__module__)
""")
    assert out.splitlines() == ["[]", "IPython.core.display IPython.core.display"]


def test_where_ipython_is_loaded_pynq_is_imported_as_it_is() -> None:
    out = _python("import IPython\n" + INSTALLED + """
import pynq, sys
print(type(sys.modules["IPython"].display).__name__, hasattr(pynq, "Overlay"))
""")
    assert out.split() == ["module", "True"]


def test_a_pynq_that_wants_more_of_ipython_is_imported_with_it(tmp_path: Path) -> None:
    """A later pynq importing another part of IPython: imported again, with the real one."""
    fake = tmp_path / "pynq"
    fake.mkdir()
    (fake / "__init__.py").write_text("from IPython.display import display\n"
                                      "from IPython.core.getipython import get_ipython\n"
                                      "WHOSE = display.__module__\n")
    out = _python(INSTALLED + "import pynq, sys\nprint(pynq.WHOSE, 'IPython' in sys.modules)\n",
                  path=tmp_path)
    assert out.split() == ["IPython.core.display_functions", "True"]
