"""`python -m oddl.controller ...` is the `oddl` command (what tests and the session use to
start a child the way a user would)."""

from oddl.controller.operator.cli.main import entry

entry()
