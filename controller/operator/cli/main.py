"""The `oddl` command group, and what every command shares: the consoles, how a bad
config is reported."""

from __future__ import annotations

import os
import sys

import click
from oddl.controller.base.config import ConfigError
from rich.console import Console

err = Console(stderr=True)
console = Console(width=None if sys.stdout.isatty() else 120)


def _config_fail(e: ConfigError) -> None:
    for issue in e.issues:
        click.echo(f"error: {issue}", err=True)
    sys.exit(2)


@click.group()
@click.version_option(package_name="oddl")
def main() -> None:
    """oddl: the ODDL optical interconnect testbed controller.

    ODDL_LOG=info (or debug) says more on stderr; warnings are always said."""
    import logging

    level = os.environ.get("ODDL_LOG", "warning").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise click.UsageError(f"ODDL_LOG={level.lower()}: one of debug, info, warning, error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
