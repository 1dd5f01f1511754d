"""What a run or an acceptance needs of its testbed, opened in one place.

- `emu` on a testbed of the sim back end: a private `oddl emulate` of it, as a child
  process (exactly what a user would start by hand); the run addresses the emu config it
  writes. (An emu config names an emulator already serving: nothing to start.)
- `hw`, and `emu` on an emu config (an emulator already serving, perhaps to others): the
  testbed lock (`TestbedBusy` names its holder).
- a published sim run: an announcer on the testbed's bus (emu and hw runs tell it on the
  connection they run the job on).

Everything opened is closed on the way out, whatever raised, in the reverse order.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from oddl.app import registry
from oddl.controller.base.config import ConfigError, ConfigIssue, Testbed
from oddl.controller.service.backend import Announce
from oddl.controller.service.lock import TestbedLock


class EmulatorFailed(RuntimeError):
    """`oddl emulate` did not come up (the message has the end of its log)."""




@dataclass(frozen=True)
class Session:
    testbed: Path  # the config the run addresses: the emulator's, for emu on a sim testbed
    announce: Announce | None  # a sim run's notes for the bus's watchers, if published


def serving(testbed: Path, tb: Testbed) -> None:
    """An emu config's emulator is serving (ConfigError, a file mistake, if it has
    stopped: the config names ports that are gone); a replay's is the cassette's."""
    if tb.emulator is not None and not registry.replaying() and \
            (gone := tb.emulator.gone()) is not None:
        raise ConfigError([ConfigIssue(str(testbed), "emulator", gone)])


@contextlib.contextmanager
def session(testbed: Path, tb: Testbed, backend: str, purpose: str, *,
            faults: list[str] | None = None, publish: bool = False, wait_s: float = 0.0,
            log: Path | None = None, say: Callable[[str], None] = print,
            locked: bool = False) -> Iterator[Session]:
    """Open what `backend` needs of the testbed at `testbed` (loaded as `tb`); `purpose`
    is what the lock says holds it; `faults` go to the emulator (`--fault`); its log goes
    to `log` (default: beside its config, in a directory removed at the end); `locked`:
    the testbed's arbiter holds the lock, and runs what needs it."""
    with contextlib.ExitStack() as stack:
        path = testbed
        what = registry.kind(backend)
        serving(testbed, tb)
        if what.private_emulator and not registry.serves(tb).devices:
            d = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oddl-emu-")))
            if registry.replaying():  # its devices are a cassette's: the config it wrote
                path = d / f"{testbed.stem}-emu.toml"
                path.write_text(registry.recorded("emulator config", str))
            else:
                m = tb.testbed
                path = stack.enter_context(emulated(
                    testbed, faults or [], d, say, log, m.board_model, m.control_model,
                    m.rtl_simulator))
                registry.recorded("emulator config", path.read_text)
        elif what.locks and not locked and not registry.replaying():  # a lab's, or an
            # emulator already serving (a replay reaches no device: nothing to hold)
            stack.enter_context(TestbedLock(registry.lock_name(tb), purpose).acquire(wait_s))
        announce = None
        if publish and not what.says_itself:
            if tb.broker.url == "embedded" and tb.emulator is None:
                raise ConfigError([ConfigIssue(
                    str(testbed), "broker", "--publish: the testbed's broker is the embedded "
                    "one, which runs only inside `oddl emulate`: publish to a serving "
                    "emulator's config (`oddl emulate TESTBED --out EMU.toml`, then `oddl run "
                    "EXPERIMENT --testbed EMU.toml --publish`), or name a broker's url")])
            announcer = registry.open_announcer(tb)
            stack.callback(announcer.close)
            announce = announcer.announce
        yield Session(path, announce)


@contextlib.contextmanager
def emulated(testbed: Path, faults: list[str], workdir: Path,
             say: Callable[[str], None], log: Path | None = None,
             board_model: str = "python", control_model: str = "python",
             rtl_simulator: str = "amaranth") -> Iterator[Path]:
    """`oddl emulate TESTBED` as a child process; yields the emu config it writes, stops
    it with SIGINT on the way out. Its log goes to `log` (default `workdir/emulator.log`):
    a pipe nobody reads fills up, and the emulator then freezes in its next write (a burst
    of warnings did it)."""
    out = workdir / f"{testbed.stem}-emu.toml"
    log = log or workdir / "emulator.log"
    cmd = [sys.executable, "-m", "oddl.app", "emulate", str(testbed), "--out", str(out),
           "--board-model", board_model, "--control-model", control_model,
           "--rtl-simulator", rtl_simulator]
    for f in faults:
        cmd += ["--fault", f]
    with log.open("w") as err:
        # a process group of its own: a terminal's Ctrl-C reaches this process, which stops
        # it (once, in order); and it goes with this process if this one is killed. Not a
        # session: Linux's autogroup gives every session an equal share of the CPU
        # whatever its nice, and `nice oddl run --backend emu` left the emulator at full
        # share. Its standard input is none: a background group reading the terminal stops
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, text=True, process_group=0,
                                preexec_fn=_die_with_parent)
    killer = threading.Timer(60, proc.kill)  # it must come up within a minute
    killer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip().startswith("fault:"):
                say(f"emulator {line.strip()}")
            if line.strip() == "ready":
                break
        killer.cancel()
        if proc.poll() is not None:
            raise EmulatorFailed(f"emulator exited ({proc.returncode}): "
                                 f"{log.read_text(errors='replace').strip()[-2000:]}")
        # what it says from here on ("stopped") is drained, never left to fill the pipe
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield out
    finally:
        killer.cancel()
        stop_emulator(proc)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when its parent dies (Linux's PDEATHSIG), so a
    `kill -9`ed run leaves no private emulator behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_emulator(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C, as a user stops `oddl emulate`; killed if it has not stopped in 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
