"""Lightning photonic compute, where the testbed has a QICK board."""

from __future__ import annotations

import pytest
from oddl.acceptance.plugin import Bench

pytestmark = pytest.mark.acceptance


def test_lightning_accuracy(bench: Bench, figure) -> None:
    """Random operand pairs (corners included) through the board: share of products
    exactly right, within one LSB, worst error; a run with no light fails by name."""
    from oddl.app.registry import open_soc
    from oddl.drivers.lightning import LightningConfig, characterize, operand_pairs

    q = bench.tb.qick
    if q is None:
        pytest.skip("the testbed config has no [qick] board")
    spec = bench.spec
    try:
        soc, soccfg = open_soc(q.soc, q.photonics, hmac_key=q.hmac_key())
    except Exception as e:
        pytest.fail(f"QICK board {q.soc}: {type(e).__name__}: {e}", pytrace=False)
    base = LightningConfig(dac_0=0, dac_1=0, dac_channels=q.dac_channels,
                           adc_channel=q.adc_channel)
    rep = characterize(soc, soccfg, operand_pairs(spec.lightning_samples), base)
    figure("exact products", round(rep["exact"], 4), spec=f">= {spec.lightning_accuracy_min}")
    figure("within 1 LSB", round(rep["within_1_lsb"], 4))
    figure("worst error", rep["worst_error_lsb"], "LSB")
    figure("runs with no light", rep["no_output"], spec="0")
    if rep["no_output"]:
        pytest.fail(f"QICK {q.soc}: {rep['no_output']} of {rep['pairs']} runs put no light "
                    "on the detector (a DAC not ready: the streamer gate held)",
                    pytrace=False)
    if rep["exact"] < spec.lightning_accuracy_min:
        pytest.fail(f"QICK {q.soc}: {100 * rep['exact']:.2f}% of products exact < "
                    f"{100 * spec.lightning_accuracy_min:.0f}% (worst {rep['worst_error_lsb']}"
                    f" LSB at {rep['worst_pair']})", pytrace=False)


def test_lightning_inference(bench: Bench, figure) -> None:
    """A 64-300-100-10 network's inference (studies/lenet.py) with every multiply on the
    board's modulator pairs, against the same network in 8-bit arithmetic: photonic
    accuracy within `lightning_inference_max_drop` of it; a pair that passes no light
    fails calibration by name."""
    from oddl.app.registry import open_core, open_inference, open_soc
    from oddl.drivers.lightning_mac import NoProduct
    from oddl.studies import lenet

    q = bench.tb.qick
    if q is None:
        pytest.skip("the testbed config has no [qick] board")
    spec = bench.spec
    why = ""
    try:
        soc, soccfg = open_soc(q.soc, q.photonics, hmac_key=q.hmac_key())
        core = open_core(soc, soccfg, q.adc_channel)
        cal = core.calibrate()
    except NoProduct as e:
        why = f"QICK {q.soc}: {e}"
    except Exception as e:
        why = f"QICK board {q.soc}: {type(e).__name__}: {e}"
    if why:
        pytest.fail(why, pytrace=False)
    figure("calibration residual", round(cal.residual_rms / 256, 4), "product LSB")
    # (the 8 x 8 digits: quick, and no extra on a lab's host; `oddl lightning infer` runs
    # MNIST)
    xtr, ytr, xte, yte = lenet.digits(dataset="digits")
    net = lenet.train(xtr, ytr)
    inf = open_inference(net, core)
    n = spec.lightning_inference_samples
    calls = core.calls
    acc, _ = lenet.accuracy(inf, net, xte[:n], yte[:n])
    acc_d, acc_p = acc["digital8"], acc["photonic"]
    bound = acc_d - spec.lightning_inference_max_drop
    figure("8-bit digital accuracy", acc_d)
    figure("photonic accuracy", acc_p, spec=f">= {bound:.3f}")
    figure("products through the board", core.products, spec=f"{n * 50_200}")
    figure("count-action firings", inf.firings)
    # paced by the board's datapath: a call a layer (by the host: a few hundred)
    figure("host calls an inference", (core.calls - calls) / n)
    if acc_p < bound:
        pytest.fail(f"QICK {q.soc}: photonic accuracy {acc_p:.3f} on {n} digits < 8-bit "
                    f"digital {acc_d:.3f} - {spec.lightning_inference_max_drop}",
                    pytrace=False)
