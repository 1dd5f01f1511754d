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
        soc, soccfg = open_soc(q.soc, q.photonics)
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
