"""Lightning's serve-time evaluation by its own setup (studies/lightning_serve.py, after
lightning-lts `simulation/`): the models, the cores' rule, a request's serve time, the
queue, and `oddl lightning serve`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.studies import lightning_serve as S


def test_the_models_are_the_releases() -> None:
    """Layer counts of the DAGs (BERT's 24 encoders of 16 heads, GPT-2's 48 of 25, DLRM's
    26 tables) and the multiplies each model takes (VGG-16's 15.47 G, as counted)."""
    assert {m: len(x.layers) for m, x in S.MODELS.items()} == {
        "AlexNet": 8, "ResNet-18": 21, "VGG-16": 16, "VGG-19": 19, "BERT": 1 + 24 * 83,
        "GPT-2": 2 + 48 * 128 + 1, "DLRM": 33}
    assert S.MODELS["VGG-16"].multiplies(1) == 15_470_264_320
    # short vectors are packed into VVPs of 2,048 (AlexNet's first layer: 121 a VVP)
    assert S.MODELS["AlexNet"].packed(2048)[1] == (2048, math.ceil(121 * 3 * 64 * 55 * 55
                                                                   / 2048))
    bert = S.MODELS["BERT"].layers
    assert bert[2].after == {1} and bert[5].after == {2, 3}  # a head: Q K^T, then x V
    assert bert[82].after == {6 + 5 * h for h in range(16)}  # the concatenation of 16
    assert S.MODELS["DLRM"].layers[30].after == set(range(1, 27)) | {29}


def test_the_cores_follow_the_releases_rule() -> None:
    """Each VVP to the next core round robin, after what that core holds (a VVP at a time,
    as the release's simulator does it) equals the dealt-out form, job after job."""
    rng = np.random.default_rng(5)
    n = 7
    cores, ends, nxt = S._Cores(n), [0] * n, 0
    for _ in range(300):
        t, vvps, size = int(rng.integers(0, 400)), int(rng.integers(1, 30)), int(
            rng.integers(1, 9))
        done = 0
        for _ in range(vvps):
            c = nxt % n
            ends[c] = max(ends[c], t) + size
            done, nxt = max(done, ends[c]), nxt + 1
        assert cores.run(t, vvps, size) == done
        assert cores.end.tolist() == ends


def test_a_request_alone_pays_its_datapath_then_its_layers() -> None:
    """AlexNet alone on Lightning: 8 x 115 ns, then each layer's VVPs over 576 cores."""
    got = S.simulate(S.PROCESSORS["lightning"], [("AlexNet", 0)], 1)["AlexNet"]
    cycles = sum(math.ceil(v / 576) * size
                 for size, v in S.MODELS["AlexNet"].packed(2048).values())
    assert got == pytest.approx((math.ceil(8 * 115 * 97) + cycles) / 97)


def test_requests_queue_and_the_run_ends_with_its_first_requests() -> None:
    proc = S.PROCESSORS["a100x"]
    one = S.simulate(proc, [("VGG-16", 0)], 1)["VGG-16"]
    two = S.simulate(proc, [("VGG-16", 0), ("VGG-16", 0)], 2)["VGG-16"]
    assert two > one * 1.4  # the second shares the cores with the first
    # a run of 1 request ends when it is done: the later one is not counted
    assert S.simulate(proc, [("VGG-16", 0), ("AlexNet", 10**9)], 1) == {"VGG-16": one}


def test_energy_is_the_releases_model() -> None:
    m = S.MODELS["ResNet-18"]  # no short vector: the same multiplies at both granularities
    light, a100 = S.PROCESSORS["lightning"], S.PROCESSORS["a100"]
    assert a100.energy_j(m) / light.energy_j(m) == pytest.approx(
        (250 / 6912 / 1.41) / (91.875 / 1024 / 97))


def test_oddl_lightning_serve_json() -> None:
    r = CliRunner().invoke(main, ["lightning", "serve", "--trials", "1", "--requests", "4",
                                  "--line-rate", "0.001", "--seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["trials"] == 1 and d["published"]["serve_time_ratio"]["a100x"] == 329
    for k in ("a100", "a100x", "brainwave"):
        by_model = d["serve_time_ratio_by_model"][k]
        assert d["serve_time_ratio"][k] == max(by_model.values())
        assert set(by_model) == set(d["models"])
    r = CliRunner().invoke(main, ["lightning", "serve", "--trials", "0"])
    assert r.exit_code == 2 and "Traceback" not in r.output


def _release_traces(folder: Path, n: int, rate: str = "0.06") -> None:
    """Traces shaped as the release's (plain lists of (model, arrival ns)), drawn here."""
    import pickle

    from oddl.studies.lightning_serve import arrivals

    folder.mkdir(parents=True, exist_ok=True)
    for k in range(1, n + 1):
        (folder / f"mixed_sched_{rate}_Gbps_{k}.pkl").write_bytes(
            pickle.dumps(arrivals(100 + k, n=40)))


def test_the_release_traces_are_read_as_data_and_run(tmp_path: Path) -> None:
    from oddl.studies.lightning_serve import arrivals, read_release_trace, serve_time

    _release_traces(tmp_path, 2)
    trace = read_release_trace(tmp_path / "mixed_sched_0.06_Gbps_1.pkl")
    assert trace == arrivals(101, n=40)
    r = serve_time(requests=5, traces=[trace])
    assert r["trials"] == 1 and r["traces"] == "the release's"
    for k, by_model in r["serve_time_ratio_by_model"].items():
        assert r["serve_time_ratio"][k] == max(by_model.values())
        assert r["serve_time_ratio_mean"][k] == pytest.approx(
            sum(by_model.values()) / len(by_model))
    res = CliRunner().invoke(main, ["lightning", "serve", "--traces", str(tmp_path),
                                    "--trials", "2", "--requests", "5"])
    assert res.exit_code == 0, res.output
    assert "mean over the models" in res.output


def test_a_release_trace_that_is_not_plain_data_is_refused(tmp_path: Path) -> None:
    import pickle

    from oddl.studies.lightning_serve import TraceError, read_release_trace

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (str(marker),))

    bad = {"global": pickle.dumps([("AlexNet", 1), Evil()]),
           "shape": pickle.dumps({"AlexNet": 1}),
           "model": pickle.dumps([("LeNet", 1)]),
           "order": pickle.dumps([("AlexNet", 5), ("AlexNet", 1)]),
           "cut": pickle.dumps([("AlexNet", 1)])[:-3]}
    for name, data in bad.items():
        p = tmp_path / f"{name}.pkl"
        p.write_bytes(data)
        with pytest.raises(TraceError, match=f"{name}.pkl"):
            read_release_trace(p)
    assert not marker.exists()
    res = CliRunner().invoke(main, ["lightning", "serve", "--traces", str(tmp_path / "no")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
