"""The scaffold every long-lived service of ours stands on: `lifecycle` (how each is
started, registered for its stop, and stopped; how every command stops on a signal) and
`http` (one bounded HTTP server lifecycle and one bearer-token check for the arbiter, the
dashboard and the emulator's drill endpoint). Imports `base` only."""
