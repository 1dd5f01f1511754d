"""This host's load, said beside a verdict a late answer can produce (issue 83)."""

from __future__ import annotations

from pathlib import Path

from oddl.controller.base.hostload import cpu_pressure, host_load

PSI = "some avg10={} avg60=34.48 avg300=10.81 total=8215391073\nfull avg10=0.00 avg60=0.00 " \
      "avg300=0.00 total=0\n"


def test_the_kernels_cpu_pressure_is_read_and_said(tmp_path: Path) -> None:
    f = tmp_path / "cpu"
    f.write_text(PSI.format("82.63"))
    assert cpu_pressure(f) == 82.63
    assert "tasks waiting for a CPU 83% of the last 10 s" in host_load(f)
    assert host_load(f).startswith("this host's load ")


def test_a_host_that_does_not_say_is_not_guessed(tmp_path: Path) -> None:
    assert cpu_pressure(tmp_path / "absent") is None
    for junk in ("", "some\n", "some avg10=x\n", "full avg10=90.0\n", "\x00" * 5000):
        (tmp_path / "junk").write_text(junk)
        assert cpu_pressure(tmp_path / "junk") is None, junk
