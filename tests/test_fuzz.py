"""Fuzzing every input a peer or a file can reach: configs, count-action programs and images,
MQTT payloads, serial replies. Each is accepted or refused with its own error; nothing
else escapes (bench/fuzz_bench.py runs 10^5 of these and prints the counts)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oddl.drivers.wss import WSSDriver, WSSError, WSSProtocolError, WSSTimeout
from oddl.sim.devices.wss import WSSModel
from oddl.sim.devices.wss_serial import SerialWSS

from bench import fuzz_targets as F

FAST = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("target", list(F.TARGETS))
@pytest.mark.parametrize("raw", F.CORPUS, ids=range(len(F.CORPUS)))
def test_corpus(target: str, raw: bytes) -> None:
    F.TARGETS[target](raw)


@FAST
@given(st.binary(max_size=3000))
def test_control_messages(raw: bytes) -> None:
    F.control_message(raw)


@FAST
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c,
                                                                        max_size=4)))
def test_job_topics(value: object) -> None:
    import json

    F.job_topic(json.dumps({"v": 2, "job": "j", "kind": "done", "node": "n0", "x": value})
                .encode())
    F.job_topic(json.dumps(value).encode())


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.randoms(use_true_random=False), st.booleans())
def test_config_files(tmp_path: Path, rng: random.Random, experiment: bool) -> None:
    seed = F.EXPERIMENT if experiment else F.TESTBED
    if experiment:  # beside a real testbed, so that the experiment's own fields are reached
        (tmp_path / "tb.toml").write_bytes(F.TESTBED)
        seed = seed.replace(b"../hw_configs/prototype-4node.toml", b"tb.toml")
    F.config_file(F.mutate(seed, rng), tmp_path, experiment)


@FAST
@given(st.randoms(use_true_random=False))
def test_count_action_text(rng: random.Random) -> None:
    F.program_text(F.mutate(F.PROGRAM.encode(), rng))


@FAST
@given(st.randoms(use_true_random=False))
def test_count_action_images(rng: random.Random) -> None:
    """Reproducer: 218 of 600 mutated images gave tracebacks (reachable from a board's
    read-back in stage 1, where it must be a read-back mismatch)."""
    F.image_json(F.mutate_image(rng))


@pytest.fixture(scope="module")
def wss() -> Iterator[tuple[SerialWSS, WSSDriver]]:
    inst = SerialWSS(WSSModel("w", 4, 2)).start()
    # short: a reply that is only noise costs the driver its whole time-out (it waits for
    # the reply behind the noise), and most of these are
    drv = WSSDriver(inst.path, timeout=0.02)
    yield inst, drv
    drv.close()
    inst.close()


@pytest.mark.realtime
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(max_codepoint=0x7E, blacklist_characters="\n\r"),
               max_size=60))
def test_serial_replies(wss: tuple[SerialWSS, WSSDriver], reply: str) -> None:
    """Whatever a device says back, the driver returns a checked value or raises one of
    its own errors."""
    inst, drv = wss
    inst.handle = lambda raw: reply  # type: ignore[method-assign]
    for call in (drv.identify, drv.get_table, drv.errors, lambda: drv.set_table([[1, 0]])):
        with contextlib.suppress(WSSError, WSSProtocolError, WSSTimeout):
            call()
