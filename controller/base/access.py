"""Who may say what on the control bus: the parties, their topics, the rules a broker holds.

Every party has its own identity (MQTT username = client id) and speaks only as itself:

    oddl-ctl    the controller: publishes jobs, hears results and statuses
    <node id>   a node program: control messages from itself, results of its own
    oddl-emu    `oddl emulate`: watches control traffic (its monitor), probes the broker
    oddl-dash   the dashboard: reads, never writes

Topics carry their sender, so that a broker's access rules can hold it to its name:

    oddl/<tb>/node/<dst>/ctl/<src>   control message src -> dst           (QoS 0)
    oddl/<tb>/status/<party>         "online" / "offline" (last will)     (QoS 1, retained)
    oddl/<tb>/job/run                JobSpec, the controller's only       (QoS 1)
    oddl/<tb>/job/stop               JobStop: one job ends now, the controller's only (QoS 1)
    oddl/<tb>/job/result/<node>      JobEvent from <node>                 (QoS 1)
    oddl/<tb>/probe/...              round-trip probes (controller, emulator)
    oddl/<tb>/telemetry/<node>       its ports, for watchers (telemetry.py)    (QoS 0)
    oddl/<tb>/telemetry/oddl-ctl/<kind>  the controller's notes for watchers   (QoS 0)
    oddl/<tb>/telemetry/oddl-ctl/ended/<job>  each job's end, retained a while (QoS 1)

The same rules are written out for Mosquitto (`oddl broker-config`) and enforced by the
embedded broker (sim/devices/broker.py). A broker cannot know which nodes a job has: the
controller and the node programs hold results to the job's nodes themselves.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CONTROLLER = "oddl-ctl"
EMULATOR = "oddl-emu"
DASHBOARD = "oddl-dash"
RESERVED = (CONTROLLER, EMULATOR, DASHBOARD)
# node ids, testbed names and parties become topic levels and usernames: no MQTT wildcards,
# no level separators, nothing a shell or a file name would trip on
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# msgspec's `pattern` searches (re.search): anchored, or "n/0" would pass as "n"
NAME_PATTERN = f"^{NAME.pattern}$"
NAME_RULE = "1-64 letters, digits, '_', '.', '-', starting with a letter or digit"


def check_name(what: str, name: str) -> str:
    if not NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r}: use {NAME_RULE} (it is an MQTT topic level)")
    return name


def ctl_topic(tb: str, dst: str, src: str) -> str:
    return f"oddl/{tb}/node/{dst}/ctl/{src}"


def status_topic(tb: str, party: str) -> str:
    return f"oddl/{tb}/status/{party}"


def health_topic(tb: str, node: str) -> str:
    """A node program's heartbeats (controller/service/health.py `Heartbeat`); `+` for all."""
    return f"oddl/{tb}/health/{node}"


def telemetry_topic(tb: str, party: str, kind: str | None = None) -> str:
    """A node's port telemetry, or (with `kind`) one of the controller's notes."""
    return f"oddl/{tb}/telemetry/{party}" + (f"/{kind}" if kind else "")


def run_topic(tb: str) -> str:
    return f"oddl/{tb}/job/run"


def stop_topic(tb: str) -> str:
    """Where the controller stops one job of several (its status going "offline" stops
    them all)."""
    return f"oddl/{tb}/job/stop"


def result_topic(tb: str, node: str) -> str:
    return f"oddl/{tb}/job/result/{node}"


def results(tb: str) -> str:
    """The filter for every node's results."""
    return result_topic(tb, "+")


def probe_ns(tb: str) -> str:
    """Where the controller (acceptance) and the emulator measure the broker's round trip,
    away from any job's topics."""
    return f"{tb}/probe"


Access = Literal["read", "write"]


@dataclass(frozen=True)
class Rule:
    access: Access
    topic: str  # an MQTT filter: '+' one level, '#' the rest


def rules(tb: str, party: str, nodes: Iterable[str]) -> list[Rule]:
    """What `party` may read and write on testbed `tb`."""
    r: Access = "read"
    w: Access = "write"
    if party == CONTROLLER:
        return [Rule(w, run_topic(tb)), Rule(w, stop_topic(tb)), Rule(r, results(tb)),
                Rule(w, status_topic(tb, party)), Rule(r, status_topic(tb, "+")),
                Rule(r, health_topic(tb, "+")), Rule(w, telemetry_topic(tb, party, "#")),
                Rule(r, f"oddl/{probe_ns(tb)}/#"), Rule(w, f"oddl/{probe_ns(tb)}/#")]
    if party == EMULATOR:
        return [Rule(r, f"oddl/{tb}/node/+/ctl/+"), Rule(w, status_topic(tb, party)),
                Rule(r, f"oddl/{probe_ns(tb)}/#"), Rule(w, f"oddl/{probe_ns(tb)}/#")]
    if party == DASHBOARD:
        return [Rule(r, f"oddl/{tb}/status/+"), Rule(r, run_topic(tb)), Rule(r, results(tb)),
                Rule(r, health_topic(tb, "+")), Rule(r, f"oddl/{tb}/telemetry/#")]
    if party in set(nodes):
        return [Rule(w, f"oddl/{tb}/node/+/ctl/{party}"), Rule(r, f"oddl/{tb}/node/{party}/ctl/+"),
                Rule(w, status_topic(tb, party)), Rule(r, status_topic(tb, "+")),
                Rule(r, run_topic(tb)), Rule(r, stop_topic(tb)), Rule(w, result_topic(tb, party)),
                Rule(r, results(tb)),
                Rule(w, health_topic(tb, party)), Rule(w, telemetry_topic(tb, party))]
    return []


def parties(nodes: Iterable[str]) -> list[str]:
    return [*RESERVED, *nodes]


def _covers(allowed: list[str], asked: list[str]) -> bool:
    """Does filter `allowed` match everything `asked` (a topic or a filter) can?"""
    for i, a in enumerate(allowed):
        if a == "#":
            return True
        if i >= len(asked) or asked[i] == "#":
            return False
        if a != "+" and a != asked[i]:
            return False
    return len(asked) == len(allowed)


def permits(granted: Iterable[Rule], access: str, topic: str) -> bool:
    """May a party with `granted` read (subscribe to, or receive) or write `topic`?"""
    asked = topic.split("/")
    return any(g.access == access and _covers(g.topic.split("/"), asked) for g in granted)


# --- Mosquitto's files ------------------------------------------------------------------------

def mosquitto_hash(password: str, salt: bytes | None = None, iterations: int = 101) -> str:
    """Mosquitto 2's password-file hash ($7$: PBKDF2-HMAC-SHA512, 12-byte salt, 64-byte key,
    what `mosquitto_passwd` writes)."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    key = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(key).decode()}"


def mosquitto_passwd(passwords: Mapping[str, str]) -> str:
    return "".join(f"{u}:{mosquitto_hash(p)}\n" for u, p in passwords.items())


def mosquitto_acl(tb: str, nodes: Iterable[str]) -> str:
    """One `user` block per party: explicit, so that no pattern lends a party another's
    topics (a `%u` pattern applies to every user, the read-only dashboard too)."""
    nodes = list(nodes)
    out = [f"# oddl access rules for testbed {tb} (generated by `oddl broker-config`)\n"]
    for p in parties(nodes):
        out.append(f"\nuser {p}\n")
        out += [f"topic {g.access} {g.topic}\n" for g in rules(tb, p, nodes)]
    return "".join(out)


def new_passwords(nodes: Iterable[str]) -> dict[str, str]:
    return {p: secrets.token_urlsafe(24) for p in parties(nodes)}


def write_mosquitto(tb: str, nodes: Iterable[str], out: Path, port: int = 1883,
                    bind: str = "127.0.0.1", max_packet: int = 4 << 20) -> dict[str, Path]:
    """Mosquitto's files for testbed `tb` in `out` (mode 0700): mosquitto.conf, passwd,
    acl, and secrets/<party>, one new password per party (mode 0600), to be handed to each
    party as its own and nobody else's."""
    nodes = list(nodes)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    out.chmod(0o700)
    (out / "secrets").mkdir(exist_ok=True, mode=0o700)
    passwords = new_passwords(nodes)
    files = {"passwd": mosquitto_passwd(passwords), "acl": mosquitto_acl(tb, nodes)}
    for party, pw in passwords.items():
        files[f"secrets/{party}"] = pw + "\n"
    files["mosquitto.conf"] = (
        f"# Mosquitto for oddl testbed {tb} (generated by `oddl broker-config`)\n"
        f"per_listener_settings false\n"
        f"listener {port} {bind}\n"
        f"allow_anonymous false\n"
        f"password_file {(out / 'passwd').resolve()}\n"
        f"acl_file {(out / 'acl').resolve()}\n"
        f"# a party is its username: nobody can take another's session over\n"
        f"use_username_as_clientid true\n"
        f"# control messages are small and must not wait for Nagle (docs/mqtt.md)\n"
        f"set_tcp_nodelay true\n"
        f"max_packet_size {max_packet}\n"
        f"max_queued_messages 10000\n"
        f"persistence false\n"
        f"# TLS: add cafile, certfile and keyfile, and use mqtts:// in the testbed\n")
    for name, text in files.items():
        write_private(out / name, text)
    return {name: out / name for name in files}


def write_private(path: Path, text: str) -> None:
    """A file only this user can read, created so (never a moment world-readable)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


MAX_SECRET_BYTES = 4096  # a token or password file; /dev/zero must not be read for GBs


def read_secret(path: Path) -> str:
    """A token or password from its file, stripped; OSError naming the reason when it
    cannot be one (unreadable, longer than MAX_SECRET_BYTES, not text)."""
    with path.open("rb") as f:
        raw = f.read(MAX_SECRET_BYTES + 1)
    if len(raw) > MAX_SECRET_BYTES:
        raise OSError(f"longer than {MAX_SECRET_BYTES} bytes: not a token file")
    try:
        return raw.decode().strip()
    except UnicodeDecodeError:
        raise OSError("not UTF-8 text: not a token file") from None
