"""Every decoder a peer or a file can reach, as a function of raw input that must either
accept it or refuse it with its own clear error (issue 13). The fuzz tests and
bench/fuzz_bench.py drive the same targets; anything else they raise is a bug."""

from __future__ import annotations

import contextlib
import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path

import msgspec
from oddl.controller.base.config import (
    ConfigError,
    FaultSpec,
    fault_issues,
    load_experiment,
    load_testbed,
)
from oddl.controller.service.health import Heartbeat
from oddl.controller.stage2.job import (
    DECODE_ERRORS,
    JOB_VERSION,
    JobEvent,
    JobSpec,
    JobStop,
    from_its_node,
    untrue,
)
from oddl.controller.stage2.wire import BusDecodeError, decode
from oddl.fpga.countaction import CountActionError, parse
from oddl.fpga.countaction_image import compile_program, decompile

ROOT = Path(__file__).resolve().parent.parent
TESTBED = (ROOT / "hw_configs" / "prototype-4node.toml").read_bytes()
EXPERIMENT = (ROOT / "experiments" / "table1-resnet50.toml").read_bytes()
PROGRAM = (ROOT / "fpga" / "programs" / "synchronized_data_streamer.ca").read_text()
IMAGE = compile_program(parse(PROGRAM))

# seeds a peer would send: a rank's report, a submitted job, a drill's fault
REPORT = json.dumps({"v": JOB_VERSION, "job": "j", "kind": "iteration", "node": "n1",
                     "iteration": 0, "t_start": 1, "t_end": 2, "stats": {"flows": 3}}).encode()
SUBMIT = (ROOT / "experiments" / "table1-resnet50.toml").read_bytes()
FAULT = b'{"kind": "slow-tx", "target": "n1/H", "tune_ns": 500, "at_iteration": 2}'

# the reproducers of issue 13, kept whatever the generators find
CORPUS: list[bytes] = [
    b"[" * 40_000, b"{" * 40_000, b'{"v": 1, "msg": ' * 5_000, b"", b"\x00\xff",
    b"1" * 5_000, b'{"v": 1e400}', b'{"v": 2, "job": "x" }', b"\x80\x04pickle",
    b'{"v": 1, "msg": {"type": "grant", "flow": 1e999}}',
    b'{"v": 2, "job": "\x80\x81"}', b'{"v": 1, "msg": {"type": "release", "src": "\xff"}}',
    json.dumps({"v": 2, "job": "j", "iterations": 10**12}).encode(),
    json.dumps({"v": JOB_VERSION, "job": "j" * 100_000, "why": "x"}).encode(),
    json.dumps({"v": JOB_VERSION, "job": "j", "why": "x" * 1_000_000}).encode(),
]

_specs = msgspec.json.Decoder(JobSpec)
_events = msgspec.json.Decoder(JobEvent)
_stops = msgspec.json.Decoder(JobStop)
_beats = msgspec.json.Decoder(Heartbeat)


def control_message(raw: bytes) -> None:
    with contextlib.suppress(BusDecodeError):
        decode(raw)


def job_topic(raw: bytes) -> None:
    """What a node program and the controller do with job/run, job/stop, job/result and
    health payloads."""
    for dec in (_specs, _stops, _events, _beats):
        with contextlib.suppress(*DECODE_ERRORS):
            dec.decode(raw)


_TB = load_testbed(ROOT / "hw_configs" / "prototype-4node.toml")


def node_report(raw: bytes) -> None:
    """A node's result as the controller takes it: decoded, held to its own topic, then
    held to what its schedule allows (issue 33, defect 5)."""
    ev = from_its_node(_events, "oddl/t/job/result/n1", raw)
    if not isinstance(ev, str) and ev.kind == "iteration":
        untrue(ev, 0, 3, ev.stats.get("flows", 0))


def http_body(raw: bytes) -> None:
    """What the arbiter's POST /jobs and the drill endpoint's POST /faults do with a body:
    a job refused with its status (Refused), a fault with its fields (ValidationError, or
    the issues of a config's [[faults]] entry)."""
    from oddl.app.submission import Refused, job_request
    from oddl.controller.base.topology import Grid
    from pydantic import ValidationError

    with contextlib.suppress(Refused):
        job_request(raw.decode("utf-8", "replace"), Grid.from_testbed(_TB), _TB, "j1", 0)
    with contextlib.suppress(ValidationError):
        fault_issues([FaultSpec.model_validate_json(raw)], _TB)


CASSETTE = b"".join(gzip.decompress((ROOT / "tests" / "data" / "cassettes" /
                                     "accept-routes.jsonl.gz").read_bytes()
                                    ).splitlines(keepends=True)[:40])


def cassette(raw: bytes, where: Path) -> None:
    """What `oddl replay` reads of a cassette (gzip, as recorded): refused with the file,
    the line and the reason, or read."""
    from oddl.drivers.cassette import CassetteError, read

    p = where / "c.jsonl.gz"
    p.write_bytes(gzip.compress(raw, 1))
    with contextlib.suppress(CassetteError):
        read(p)


def config_file(raw: bytes, where: Path, experiment: bool = False) -> None:
    p = where / ("e.toml" if experiment else "tb.toml")
    p.write_bytes(raw)
    with contextlib.suppress(ConfigError):
        (load_experiment if experiment else load_testbed)(p)


def program_text(raw: bytes) -> None:
    with contextlib.suppress(CountActionError):
        compile_program(parse(raw.decode("utf-8", "replace")))


def image_json(raw: bytes) -> None:
    with contextlib.suppress(ValueError, RecursionError, CountActionError):
        decompile(json.loads(raw))


def image_round_trip(raw: bytes) -> None:
    """What decompile accepts prints as text (`oddl countaction decompile`) that parses
    back to the same registers; anything else is a failure (issue 33, defect 14)."""
    try:
        prog = decompile(json.loads(raw))
    except (ValueError, RecursionError, CountActionError):
        return
    back = parse(prog.text(), dict(prog.params))
    if compile_program(back)["modules"] != compile_program(prog)["modules"]:
        raise AssertionError("decompile -> text -> parse changed the registers")


def mutate(seed: bytes, rng: random.Random, n: int = 4) -> bytes:
    """A few byte-level edits: flips, insertions of interesting tokens, cuts."""
    b = bytearray(seed)
    tokens = [b"[", b"{", b"\"", b"=", b"\n", b"1e400", b"-1", b"inf", b"nan", b"0",
              b"99999999999999999999", b"\xff", b"#", b"/", b"{row}", b"{", b"\"\"\"", b"]]"]
    for _ in range(rng.randint(1, n)):
        op = rng.random()
        i = rng.randrange(len(b) + 1)
        if op < 0.3 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op < 0.7:
            b[i:i] = rng.choice(tokens) * rng.choice((1, 1, 1, 50))
        elif b:
            del b[i:i + rng.randint(1, 40)]
    return bytes(b)


def mutate_image(rng: random.Random) -> bytes:
    """A compiled image with a field changed to a wrong value, type or shape."""
    img = json.loads(json.dumps(IMAGE))
    mod = rng.choice(img["modules"])
    regs = mod["registers"]
    key = rng.choice([*regs, "slot", "name", "modules", "design"])
    junk = rng.choice([rng.randrange(1 << 32), -1, "x", None, [], {}, 1.5, 1 << 70])
    if key in regs:
        regs[key] = junk
    elif key == "modules":
        img["modules"] = junk
    elif key == "design":
        img["design"] = junk
    else:
        mod[key] = junk
    return json.dumps(img).encode()


TARGETS: dict[str, Callable[[bytes], None]] = {
    "control message": control_message,
    "job topics": job_topic,
    "count-action text": program_text,
    "count-action image": image_json,
    "image round trip": image_round_trip,
    "node report": node_report,
    "HTTP body": http_body,
}
