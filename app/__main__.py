"""`python -m oddl.app ...` is the `oddl` command (what tests and the session use to
start a child the way a user would)."""

from oddl.app.cli.main import entry

entry()
