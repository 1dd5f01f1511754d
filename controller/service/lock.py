"""The testbed lock: one acceptance run or experiment on a physical testbed at a time.

An advisory `flock` on a per-testbed file, so that a holder that crashes or is killed
releases it with its process (no stale locks to clean up by hand). The file carries the
holder's description (pid, user, host, command, since) so that whoever is refused or kept
waiting is told exactly who has the testbed.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any


class TestbedBusy(RuntimeError):
    __test__ = False  # not a pytest class

    def __init__(self, testbed: str, holder: dict[str, Any], waited_s: float,
                 kind: str = "testbed") -> None:
        self.testbed = testbed
        self.holder = holder
        since = holder.get("since", "?")
        who = (f"{holder.get('command', '?')} (pid {holder.get('pid', '?')}, "
               f"{holder.get('user', '?')}@{holder.get('host', '?')}, since {since})")
        waited = f" after waiting {waited_s:.0f} s" if waited_s else ""
        super().__init__(f"{kind} {testbed!r} is in use by {who}{waited}")


def lock_dir() -> Path:
    """Shared by everyone on the lab machine: $ODDL_LOCK_DIR, else /tmp/oddl-locks."""
    return Path(os.environ.get("ODDL_LOCK_DIR", "/tmp/oddl-locks"))


class TestbedLock:
    __test__ = False

    def __init__(self, testbed: str, purpose: str | None = None,
                 directory: Path | None = None, kind: str = "testbed") -> None:
        """`kind`: what is locked, as the refusal says it; a lock in its own `directory`
        (an arbiter's state) leaves that directory's mode alone."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", testbed)
        self.testbed, self.kind, self.shared = testbed, kind, directory is None
        self.path = (directory or lock_dir()) / f"{safe}.lock"
        self.purpose = purpose or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self._fd: int | None = None

    def holder(self) -> dict[str, Any]:
        try:
            held = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return held if isinstance(held, dict) else {}

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.2) -> TestbedLock:
        """Take the lock, waiting up to `wait_s` seconds; TestbedBusy names the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.shared:
            with contextlib.suppress(OSError):  # not ours to chmod: someone made it shared
                os.chmod(self.path.parent, 0o1777)  # shared like /tmp: sticky, all may lock
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 if self.shared else 0o600)
        if self.shared:
            with contextlib.suppress(OSError):  # another user's runs must be able to lock it
                os.fchmod(fd, 0o666)
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - t0
                if waited >= wait_s:
                    os.close(fd)
                    raise TestbedBusy(self.testbed, self.holder(), waited, self.kind) from None
                time.sleep(min(poll_s, wait_s - waited))
        me = {"pid": os.getpid(), "user": getpass.getuser(), "host": socket.gethostname(),
              "command": self.purpose, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> TestbedLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()
