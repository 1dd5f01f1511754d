"""A cassette: every exchange of one command with its devices, to replay the command
without them (docs/cassettes.md).

Recorded at the protocol boundary, where the drivers meet the devices: each board's
register reads and writes (pynq MMIO, local or over PYNQ.remote) and whether it opened,
each WSS's lines out and in (pyserial), each MQTT party's messages published and delivered,
a drill's requests to the emulator's endpoint (httpx), each call on a QICK board's soc
(drivers/soc_tape.py), and the values of this host's a command sends (`value`: a session's
name, an emulator's config). A cassette is JSON Lines, gzip-compressed: a header (the
format and its version, the command, its configs' text), one event a line (`t`: seconds
since the start; `dev`: the device; `i`: its index on that device; `k`: the kind; what was
sent and what came back; `h`: a digest chained per device), then a footer (the command's
result). No secret is written: passwords never cross these boundaries (MQTT's CONNECT is
not a message; HTTP headers are not recorded).

Replayed, the same driver code gets its answers from the cassette, at the recording's
pace: each device's events are taken in the order recorded (`relaxed`: a register read by
its address, anywhere ahead of the other reads), and the first request the recording does
not hold stops the asking code with a `Divergence` naming the device, the event, what was
recorded, what was asked and its stack. What a run's loop only observes is answered by
time instead (`Player.observed`).

The cassette in use is this process's (`active`): set by the command that records or
replays (`recording`, `playing`, through app/registry.py), read where the drivers open
devices.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
from oddl.drivers.seal import SIGNED, Signature
from oddl.drivers.soc_values import why_not_value

T = TypeVar("T")
FORMAT = "oddl-cassette"
VERSION = 1
MAX_EVENTS = 5_000_000  # a cassette's, read back (an acceptance: ~4,000)


class CassetteError(ValueError):
    """A file that is no cassette this oddl can play (the message names it and why)."""


class Divergence(RuntimeError):
    """The replayed command asked a device something the recording does not hold here."""

    def __init__(self, device: str, index: int, recorded: dict[str, Any] | None,
                 asked: dict[str, Any], stack: str) -> None:
        self.device, self.index, self.recorded, self.asked = device, index, recorded, asked
        self.stack = stack
        was = "nothing more" if recorded is None else json.dumps(_public(recorded))
        super().__init__(f"replay diverged on {device}, event {index}: recorded {was}; "
                         f"asked {json.dumps(asked)}")


STAGE1_THREADS = ("oddl-stage1", "oddl-device")  # the names of stage 1's threads (lab.py)


def stream(dev: str) -> str:
    """The device's stream for the calling code: stage 1 (its own threads) apart from
    the loop's polls of the same device (the watch, a stopped job's light), whose
    interleaving with it is the host's timing, not the code's behaviour."""
    name = threading.current_thread().name
    return f"{dev}@stage1" if name.startswith(STAGE1_THREADS) else dev


def _chain(prev: str, ev: dict[str, Any]) -> str:
    """An event's digest, chained to its device's previous one: an event changed after
    it was recorded is found, and named, on replay."""
    return hashlib.sha256((prev + json.dumps(ev)).encode()).hexdigest()[:8]


def _asker() -> str:
    """The asking code's stack: its own frames, not the test runner's nor ours."""
    frames = [f for f in traceback.extract_stack()[:-3]
              if not any(x in f.filename for x in ("/_pytest/", "/pluggy/", "/asyncio/"))]
    return "".join(traceback.format_list(frames[-MAX_FRAMES:]))


MAX_FRAMES = 8


def _public(ev: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if k not in ("dev", "t", "h")}


def _value(data: int | bytes) -> int | str:
    """A register write's value as JSON holds it: an int, or bytes as hex."""
    return data if isinstance(data, int) else "0x" + bytes(data).hex()


class Recorder:
    """Writes a cassette as the command runs (one lock: device calls come from threads)."""

    def __init__(self, path: Path, header: dict[str, Any], key: bytes | None = None) -> None:
        """`key`: every line signed with it (drivers/seal.py)."""
        self.path = path
        # open for the command's life (closed with its result)
        self._f = gzip.open(path, "wt", encoding="utf-8")  # noqa: SIM115
        self._t0 = time.monotonic()
        self._sig = Signature(key) if key is not None else None
        self._write({"format": FORMAT, "version": VERSION, **header,
                     **({"signed": SIGNED} if key is not None else {}),
                     "t0_ns": round(self._t0 * 1e9)})
        self._lock = threading.Lock()
        self._n: dict[str, int] = {}
        self._h: dict[str, str] = {}  # each device's last digest
        self.events = 0

    def event(self, dev: str, kind: str, **fields: Any) -> None:
        with self._lock:
            i = self._n.get(dev, 0)
            self._n[dev] = i + 1
            self.events += 1
            ev = {"t": round(time.monotonic() - self._t0, 6), "dev": dev, "i": i, "k": kind,
                  **fields}
            self._h[dev] = ev["h"] = _chain(self._h.get(dev, ""), ev)
            self._write(ev)

    def _write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj) + "\n"
        if self._sig is not None:
            self._sig.add(line)
        self._f.write(line)

    def count(self, dev: str) -> int:
        with self._lock:
            return self._n.get(dev, 0)

    def close(self, result: dict[str, Any]) -> str:
        """The footer written, the file closed; what it holds, said in a line."""
        with self._lock:
            self._write({"end": result})
            if self._sig is not None:
                self._f.write(self._sig.line())
            self._f.close()
        return (f"recorded {self.events:,} exchanges with the devices to {self.path} "
                f"({self.path.stat().st_size / 1024:.0f} KiB)")


class TapedMMIO:
    """pynq MMIO, each access written to the cassette."""

    def __init__(self, mmio: Any, dev: str, rec: Recorder) -> None:
        self._mmio, self.dev, self._rec = mmio, dev, rec

    def read(self, offset: int = 0, length: int = 4, word_order: str = "little") -> int:
        v = int(self._mmio.read(offset, length))
        self._rec.event(stream(self.dev), "r", a=offset, v=v)
        return v

    def write(self, offset: int, data: int | bytes) -> None:
        self._rec.event(stream(self.dev), "w", a=offset, v=_value(data))
        self._mmio.write(offset, data)


class TapedSerial:
    """A pyserial port, each line out and in written to the cassette (latin-1: bytes as
    they were, noise included)."""

    def __init__(self, port: Any, dev: str, rec: Recorder) -> None:
        self._port, self.dev, self._rec = port, dev, rec
        self.port = getattr(port, "port", dev)

    @property
    def timeout(self) -> float | None:
        return float(self._port.timeout) if self._port.timeout is not None else None

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._port.timeout = value

    def reset_input_buffer(self) -> None:
        self._port.reset_input_buffer()

    def write(self, data: bytes) -> int | None:
        self._rec.event(stream(self.dev), "tx", d=bytes(data).decode("latin-1"))
        n: int | None = self._port.write(data)
        return n

    def read_until(self, expected: bytes = b"\n", size: int | None = None) -> bytes:
        raw = bytes(self._port.read_until(expected, size))
        self._rec.event(stream(self.dev), "rx", d=raw.decode("latin-1"))
        return raw

    def close(self) -> None:
        self._port.close()


class Player:
    """Serves a cassette's answers to the drivers; the first divergence is kept (a check
    may catch the error; the replay still fails on it)."""

    def __init__(self, path: Path, relaxed: bool = False, key: bytes | None = None) -> None:
        self.path, self.relaxed = path, relaxed
        self.header, self.result, events = read(path, key)
        self.signature = signature(self.header, key is not None)
        self.by_dev: dict[str, list[dict[str, Any]]] = {}
        self.altered: list[str] = []  # events changed since they were recorded, named
        last: dict[str, str] = {}
        for ev in events:
            dev = ev["dev"]
            self.by_dev.setdefault(dev, []).append(ev)
            h = ev.pop("h", None)
            want = _chain(last.get(dev, ""), ev)
            if h != want and len(self.altered) < 20:
                self.altered.append(f"{dev} event {ev['i']} {json.dumps(_public(ev))}")
            last[dev] = h if isinstance(h, str) else want
        self._used: dict[str, set[int]] = {d: set() for d in self.by_dev}
        self._next: dict[str, int] = dict.fromkeys(self.by_dev, 0)  # first unused index
        self._lock = threading.Lock()
        self.first: Divergence | None = None
        self._t0: float | None = None  # the replay's clock at the recording's 0
        self._progress = 0.0  # the recorded time of the latest event replayed in order

    def observed(self, dev: str) -> bool:
        """A run's devices as its loop observes them (the watch's polls, a stopped job's
        light): each answered with what the device said when the replay's progress was
        recorded, after the same stage 1 writes (`_span`), not in the order asked (how
        often the loop looked is its timing)."""
        return self.header.get("kind") == "run" and not dev.endswith("@stage1") and \
            dev.startswith(("board:", "wss:"))

    def _diverge(self, dev: str, k: int, ev: dict[str, Any] | None, kind: str,
                 asked: dict[str, Any]) -> Divergence:
        """The divergence at the device's event `k` (the first one is kept)."""
        d = Divergence(dev, k, ev, {"k": kind, **asked}, _asker())
        self.first = self.first or d
        return d

    def _unused(self, dev: str) -> int:
        """The device's first event not yet taken (under the lock)."""
        evs, used = self.by_dev.get(dev, []), self._used.setdefault(dev, set())
        k = self._next.get(dev, 0)
        while k < len(evs) and k in used:
            k += 1
        self._next[dev] = k
        return k

    def _span(self, dev: str) -> range:
        """The observed device's events recorded between the same two of its stage 1
        exchanges as the replay now is (under the lock): what stage 1 wrote is what a
        poll read, however soon after the writes the loop polls."""
        evs, s1 = self.by_dev.get(dev, []), self.by_dev.get(f"{dev}@stage1", [])
        done = len(self._used.get(f"{dev}@stage1", ()))
        lo = s1[done - 1]["t"] if done else -1.0
        hi = s1[done]["t"] if done < len(s1) else float("inf")
        first = next((j for j, ev in enumerate(evs) if ev["t"] > lo), len(evs))
        return range(first, next((j for j in range(first, len(evs)) if evs[j]["t"] >= hi),
                                 len(evs)))

    def _observe(self, dev: str, kind: str, asked: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            evs, used = self.by_dev.get(dev, []), self._used.setdefault(dev, set())
            if kind == "rx":  # the answer to the line just matched
                k = self._next.get(dev, len(evs))
            else:
                match = [j for j in range(len(evs)) if evs[j]["k"] == kind and all(
                    evs[j].get(f) == v for f, v in asked.items())]
                span = self._span(dev)
                match = [j for j in match if j in span] or match
                before = [j for j in match if evs[j]["t"] <= self._progress]
                k = before[-1] if before else match[0] if match else len(evs)
            ev = evs[k] if k < len(evs) else None
            if ev is None or ev["k"] != kind:
                raise self._diverge(dev, k, ev, kind, asked)
            used.add(k)
            self._next[dev] = k + 1
            return ev

    def take(self, dev: str, kind: str, **asked: Any) -> dict[str, Any]:
        """The device's next event, which must be a `kind` with `asked`'s fields; a read
        (`kind` "r") with `relaxed`: the next read of that address."""
        if self.observed(dev):
            return self._observe(dev, kind, asked)
        with self._lock:
            evs, used = self.by_dev.get(dev, []), self._used.setdefault(dev, set())
            k = self._unused(dev)
            if self.relaxed and kind == "r":
                k = next((j for j in range(k, len(evs)) if j not in used
                          and evs[j]["k"] == "r" and evs[j]["a"] == asked["a"]), len(evs))
            elif self.relaxed:
                k = next((j for j in range(k, len(evs)) if j not in used
                          and evs[j]["k"] != "r"), len(evs))
            ev = evs[k] if k < len(evs) else None
            if ev is None or ev["k"] != kind or any(ev.get(f) != v for f, v in asked.items()):
                raise self._diverge(dev, k, ev, kind, asked)
            used.add(k)
            self._progress = max(self._progress, ev["t"])
            if self._t0 is None:
                self._t0 = time.monotonic() - ev["t"]
            due = self._t0 + ev["t"]
        # the recording's pace: nothing is answered sooner after the start than it was
        # (a figure the suite times on its own clock comes out as recorded, or later)
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        return ev

    def following(self, dev: str, kind: str) -> list[dict[str, Any]]:
        """The device's next events while they are of `kind` (taken)."""
        out = []
        with self._lock:
            evs, used = self.by_dev.get(dev, []), self._used.setdefault(dev, set())
            k = self._unused(dev)
            while k < len(evs) and evs[k]["k"] == kind:
                used.add(k)
                out.append(evs[k])
                self._progress = max(self._progress, evs[k]["t"])
                k = self._unused(dev)
        return out

    def clock_shift_ns(self) -> int:
        """How far this replay's monotonic clock is from the recording's, at the same
        point of the recording."""
        with self._lock:
            t0 = self._t0 if self._t0 is not None else time.monotonic()
        return round(t0 * 1e9) - int(self.header.get("t0_ns", 0))

    def left(self) -> dict[str, int]:
        """Each device's events the replay did not ask for."""
        return {d: len(evs) - len(self._used.get(d, ())) for d, evs in self.by_dev.items()
                if len(evs) > len(self._used.get(d, ())) and not self.observed(d)}

    # the devices, played
    def mmio(self, dev: str) -> PlayedMMIO:
        return PlayedMMIO(dev, self)

    def serial(self, dev: str, port: str) -> PlayedSerial:
        return PlayedSerial(dev, self, port)

    def opened(self, dev: str) -> None:
        """The device opened when it was (a device that could not be reached raises what
        it raised then)."""
        self.take(dev, "open")
        with self._lock:
            evs, k = self.by_dev.get(dev, []), self._unused(dev)
        if k < len(evs) and evs[k]["k"] == "unreachable":
            raise ConnectionError(self.take(dev, "unreachable")["error"])


class PlayedMMIO:
    def __init__(self, dev: str, player: Player) -> None:
        self.dev, self._p = dev, player

    def read(self, offset: int = 0, length: int = 4, word_order: str = "little") -> int:
        return int(self._p.take(stream(self.dev), "r", a=offset)["v"])

    def write(self, offset: int, data: int | bytes) -> None:
        self._p.take(stream(self.dev), "w", a=offset, v=_value(data))


class PlayedSerial:
    def __init__(self, dev: str, player: Player, port: str) -> None:
        self.dev, self._p = dev, player
        self.port = port  # as the driver names it in its errors
        self.timeout: float | None = None

    def reset_input_buffer(self) -> None:
        pass

    def write(self, data: bytes) -> int:
        self._p.take(stream(self.dev), "tx", d=bytes(data).decode("latin-1"))
        return len(data)

    def read_until(self, expected: bytes = b"\n", size: int | None = None) -> bytes:
        return str(self._p.take(stream(self.dev), "rx")["d"]).encode("latin-1")

    def close(self) -> None:
        pass


MAX_LINE = 16 << 20  # bytes of one line (an MQTT message of 4 MB, latin-1 in JSON: < 12)
MAX_BYTES = 1 << 30  # a cassette's, uncompressed (an acceptance: ~1 MB; Table 1 on emu: ~50)
MAX_RECORDING_S = 24 * 3600.0  # a recording's length (a run over an hour asks --force)
_TEXT, _INT = (str,), (int,)
# each kind of event: its fields and their types (what the players read of it)
FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "r": {"a": _INT, "v": _INT}, "w": {"a": _INT, "v": (int, str)},
    "tx": {"d": _TEXT}, "rx": {"d": _TEXT}, "open": {}, "unreachable": {"error": _TEXT},
    "value": {"name": _TEXT}, "req": {"m": _TEXT, "path": _TEXT, "body": _TEXT},
    "resp": {"status": _INT, "body": _TEXT}, "pub": {"topic": _TEXT, "p": _TEXT},
    "recv": {"topic": _TEXT, "p": _TEXT},
    "call": {"m": _TEXT, "a": (list,)}, "ret": {}}  # a QICK soc's (drivers/soc_tape.py)
# the header: the fields every one has, and those of each kind of command that writes one
HEADER: dict[str, tuple[type, ...]] = {"kind": _TEXT, "argv": (list,), "testbed": _TEXT}
KINDS: dict[str, dict[str, tuple[type, ...]]] = {
    "accept": {"only": (list,)},
    "run": {"experiment": _TEXT, "backend": _TEXT, "iterations": (int, type(None))}}
OPTIONAL: dict[str, tuple[type, ...]] = {"t0_ns": _INT}  # (not in the first recordings)
RESULTS = {"accept": "summary", "run": "result"}  # the footer's key, by kind


def _typed(v: Any, types: tuple[type, ...]) -> bool:
    return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)


def _why_not_event(obj: Any) -> str | None:
    """Why a line is no event this oddl plays, or None."""
    if not isinstance(obj, dict) or not {"t", "dev", "i", "k"} <= obj.keys():
        return "not an event (t, dev, i, k)"
    t, k = obj["t"], obj["k"]
    if not _typed(t, (int, float)) or not 0 <= t <= MAX_RECORDING_S:
        return f"t = {t!r}: not a time within a recording (0 to {MAX_RECORDING_S:g} s)"
    if not _typed(obj["dev"], _TEXT) or not _typed(obj["i"], _INT) or obj["i"] < 0:
        return "dev must be text and i a count"
    if not isinstance(k, str) or k not in FIELDS:  # (a list or dict is no key to look up)
        return f"k = {k!r:.40}: no kind of event this oddl records ({', '.join(FIELDS)})"
    for f, types in FIELDS[k].items():
        if not _typed(obj.get(f), types):
            return (f"a {k!r} event's {f!r} is {type(obj.get(f)).__name__}, not "
                    f"{' or '.join(x.__name__ for x in types)}")
    if k in ("call", "ret"):  # a QICK soc's arguments and answers
        if "e" in obj and not _typed(obj["e"], _TEXT):
            return "a 'ret' event's 'e' is not text"
        if why := why_not_value(obj.get("a" if k == "call" else "v")):
            return f"a QICK {k!r} event's value: {why}"
    return None


def _why_not_header(obj: Any) -> str | None:
    """Why a first line is no header of a cassette this oddl plays, or None."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        return f"not an oddl cassette (its first line names no format {FORMAT!r})"
    if obj.get("version") != VERSION:
        return f"cassette version {obj.get('version')!r}; this oddl plays version {VERSION}"
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        return (f"a cassette of {kind!r:.40}: this oddl replays `oddl accept` and "
                f"`oddl run`")
    for f, types in (HEADER | KINDS[kind] | OPTIONAL).items():
        if (f in obj and not _typed(obj[f], types)) or (f not in obj and f not in OPTIONAL):
            return f"header: {f!r} missing or not {' or '.join(x.__name__ for x in types)}"
    for f in ("argv", "only"):
        if not all(isinstance(a, str) for a in obj.get(f, [])):
            return f"header: {f!r} holds something other than text"
    return None


_CHECK = {"check": _TEXT, "outcome": _TEXT, "message": _TEXT, "figures": (list,)}
_FIGURE = {"name": _TEXT, "unit": _TEXT, "value": (int, float, str, type(None))}


def _why_not_result(kind: str, end: Any) -> str | None:
    """Why a footer is no result of a `kind` command that a replay can compare, or None."""
    want = RESULTS[kind]
    if not isinstance(end, dict) or want not in end or \
            not isinstance(end[want], dict | None):
        return f"no {want!r}"
    if kind != "accept" or end[want] is None:
        return None  # a run's result is compared as JSON, whatever its shape
    checks = end[want].get("checks")
    if not isinstance(checks, list):
        return "its summary holds no list of checks"
    for c in checks:
        if not isinstance(c, dict) or any(not _typed(c.get(f), t) for f, t in _CHECK.items()):
            return f"a check is not {{{', '.join(_CHECK)}}} of their types: {str(c)[:80]}"
        for fig in c["figures"]:
            if not isinstance(fig, dict) or any(not _typed(fig.get(f), t)
                                                for f, t in _FIGURE.items()):
                return f"a figure of {c['check']} is not {{{', '.join(_FIGURE)}}}"
    return None


def read(path: Path, key: bytes | None = None) -> tuple[dict[str, Any], dict[str, Any] | None,
                                                       list[dict[str, Any]]]:
    """A cassette's header, result (None: the recording was cut short) and events;
    CassetteError naming the file, the line and what is wrong. Every line, the whole and
    every event's time are bounded (MAX_LINE, MAX_BYTES, MAX_RECORDING_S) and every event
    is of a kind this oddl records, with its fields' types: a cassette is data, and one
    made to exhaust or stall a replay is refused, said why."""
    events: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    result = None
    total = 0
    sig = Signature(key) if key is not None else None
    signed: object = None  # the last line's HMAC, if it has one
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            n = 0
            while line := f.readline(MAX_LINE + 1):
                n += 1
                total += len(line)
                if len(line) > MAX_LINE:
                    raise CassetteError(f"{path}: line {n}: longer than {MAX_LINE:,} "
                                        f"characters")
                if total > MAX_BYTES:
                    raise CassetteError(f"{path}: more than {MAX_BYTES:,} characters")
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    if line.endswith("\n"):
                        raise CassetteError(f"{path}: line {n}: not JSON ({e})") from None
                    break  # the last line of a recording cut short
                if signed is not None:
                    raise CassetteError(f"{path}: line {n}: after its signature")
                if isinstance(obj, dict) and header is not None and set(obj) == {"hmac"}:
                    signed = obj["hmac"]
                    continue
                if sig is not None:
                    sig.add(line)
                if header is None:
                    if why := _why_not_header(obj):
                        raise CassetteError(f"{path}: {why}")
                    header = obj
                elif isinstance(obj, dict) and "end" in obj:
                    if why := _why_not_result(header["kind"], obj["end"]):
                        raise CassetteError(f"{path}: line {n}: the result: {why}")
                    result = obj["end"]
                elif why := _why_not_event(obj):
                    raise CassetteError(f"{path}: line {n}: {why}")
                else:
                    if len(events) >= MAX_EVENTS:
                        raise CassetteError(f"{path}: more than {MAX_EVENTS:,} events")
                    events.append(obj)
    except (OSError, EOFError, UnicodeDecodeError, RecursionError) as e:
        raise CassetteError(f"{path}: cannot be read: {e}") from None
    if header is None:
        raise CassetteError(f"{path}: empty")
    if sig is not None:  # asked to check: signed with this key, or refused
        if header.get("signed") != SIGNED:
            raise CassetteError(f"{path}: unsigned: a key was given, so a cassette signed "
                                f"with it is asked for")
        if not sig.matches(signed):
            raise CassetteError(f"{path}: its signature does not match the key: changed "
                                f"since it was recorded, cut short, or signed with another")
    return header, result, events


def signature(header: dict[str, Any], checked: bool) -> str:
    """What a replay says of its cassette's signature."""
    if header.get("signed") != SIGNED:
        return "unsigned"
    return "signed, checked" if checked else "signed, not checked (no --key)"


# the cassette this process records to or plays from (None: the devices themselves)
active: Recorder | Player | None = None


def value(name: str, make: Callable[[], T]) -> T:
    """A value the command makes of this host's clock or identity (a session's name, an
    emulator's config): made and recorded; replayed, the recorded one (so that what the
    command sends with it is what it sent)."""
    if isinstance(active, Player):
        v: T = active.take("host", "value", name=name)["v"]
        return v
    v = make()
    if isinstance(active, Recorder):
        active.event("host", "value", name=name, v=v)
    return v


def host_ns(ns: int) -> int:
    """A reading of this host's monotonic clock that a device answered with (the
    emulator's, on the same host): replayed, moved onto the replay's clock."""
    if isinstance(active, Player):
        return ns + active.clock_shift_ns()
    return ns


def tap_mmio(dev: str, mmio: Any) -> Any:
    """A board's registers as the drivers reach them: recorded, or as they are."""
    return TapedMMIO(mmio, dev, active) if isinstance(active, Recorder) else mmio


def tap_serial(dev: str, port: Any) -> Any:
    """A serial port as the drivers reach it: recorded, or as it is."""
    return TapedSerial(port, dev, active) if isinstance(active, Recorder) else port


def opened(dev: str, open_: Callable[[], T], play: Callable[[Player], T]) -> T:
    """A device's driver: `open_()` on the device (a failure to reach it, before any
    exchange, recorded); replayed, `play(player)` on its record (or what reaching it
    raised then)."""
    if isinstance(active, Player):
        active.opened(dev)
        return play(active)
    rec = active
    if isinstance(rec, Recorder):
        rec.event(dev, "open")
    before = rec.count(dev) if isinstance(rec, Recorder) else 0
    try:
        return open_()
    except Exception as e:  # an error of the exchange itself replays by itself
        if isinstance(rec, Recorder) and rec.count(dev) == before:
            rec.event(dev, "unreachable", error=str(e))
        raise


@contextlib.contextmanager
def recording(path: Path, header: dict[str, Any], key: bytes | None = None
              ) -> Iterator[Recorder]:
    """This process's device traffic onto cassette `path` (the caller closes it, with its
    result; `key`: signed with it)."""
    global active
    rec = active = Recorder(path, header, key)
    try:
        yield rec
    finally:
        active = None


@contextlib.contextmanager
def playing(path: Path, relaxed: bool = False, key: bytes | None = None
            ) -> Iterator[Player]:
    """This process's devices served from cassette `path` (CassetteError: it cannot be).
    While it plays, this process connects to nothing: a cassette is data, and an address
    in it (a board, a broker, a QICK board's name server) is never reached, whatever code
    would reach it (`_no_connection`)."""
    global active, _audit_installed
    player = Player(path, relaxed, key)
    if not _audit_installed:  # (a hook cannot be removed: it looks at `active`)
        sys.addaudithook(_no_connection)
        _audit_installed = True
    active = player
    try:
        yield player
    finally:
        active = None


_audit_installed = False


class Reached(ConnectionRefusedError):
    """A replay's code tried to connect somewhere: refused (a cassette is data)."""


def _no_connection(event: str, args: tuple[Any, ...]) -> None:
    """Python's audit hook: a socket's connect while a cassette plays is refused, named."""
    if event == "socket.connect" and isinstance(active, Player) and len(args) > 1:
        raise Reached(f"a replay reaches no device: a connection to {args[1]!r} refused "
                      f"(what the cassette does not hold is not fetched)")


class TapedTransport(httpx.AsyncBaseTransport):
    """An HTTP client's transport, each request and answer written to the cassette (the
    method, the path and the body: no header, so no token)."""

    def __init__(self, dev: str, rec: Recorder) -> None:
        self.dev, self._rec = dev, rec
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._rec.event(self.dev, "req", m=request.method, path=request.url.path,
                        body=(await request.aread()).decode("latin-1"))
        resp = await self._inner.handle_async_request(request)
        try:
            data = await resp.aread()
        finally:
            await resp.aclose()
        self._rec.event(self.dev, "resp", status=resp.status_code,
                        body=data.decode("latin-1"))
        return httpx.Response(resp.status_code, content=data, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class PlayedTransport(httpx.AsyncBaseTransport):
    """An HTTP endpoint served from the cassette: the request held to the recorded one."""

    def __init__(self, dev: str, player: Player) -> None:
        self.dev, self._p = dev, player

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._p.take(self.dev, "req", m=request.method, path=request.url.path,
                     body=(await request.aread()).decode("latin-1"))
        ev = self._p.take(self.dev, "resp")
        return httpx.Response(int(ev["status"]), content=str(ev["body"]).encode("latin-1"),
                              request=request)


def http_transport(dev: str) -> httpx.AsyncBaseTransport | None:
    """The transport of an HTTP client of a device's endpoint (None: httpx's own)."""
    if isinstance(active, Recorder):
        return TapedTransport(dev, active)
    if isinstance(active, Player):
        return PlayedTransport(dev, active)
    return None
