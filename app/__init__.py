"""The operator's side: the `oddl` CLI (a thin layer over `api`), the public API (the one
writer of a run directory), the session that opens what a run needs of its testbed
(emulator, lock, announcer), the dashboard and the acceptance runner. The application
layer: back ends only through `oddl.app.registry`, but for the CLI commands that
are a back end's own (`emulate`, `lightning`, `optinc`)."""
