"""Testbed configs: the shipped files load; each broken rule gives its own clear message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main
from oddl.controller.base.config import ConfigError, load_experiment, load_testbed

PROTO = """
[testbed]
name = "p"
[grid]
rows = 1
cols = 4
[optical]
line_rate_gbps = 100
tuning_time_ns = 10.5
wavelengths_nm = [1565.941, 1546.5377]
[control]
latency_ns = 1000
{nodes}
[[wss]]
id = "w0"
axis = "row"
index = 0
ports = {ports}
"""
NODE = '[[nodes]]\nid = "{id}"\nrow = {row}\ncol = {col}\n'


def four(ids: tuple[str, ...] = ("a", "b", "c", "d"), cols: tuple[int, ...] = (0, 1, 2, 3),
         rows: tuple[int, ...] = (0, 0, 0, 0)) -> str:
    return "".join(NODE.format(id=i, row=r, col=c) for i, r, c in zip(ids, rows, cols,
                                                                       strict=True))


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "tb.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", ["prototype-4node", "grid-64", "grid-1024", "grid-4096"])
def test_shipped_testbeds_load(root: Path, name: str) -> None:
    tb = load_testbed(root / "hw_configs" / f"{name}.toml")
    assert tb.n_nodes == tb.grid.rows * tb.grid.cols
    if name == "prototype-4node":
        assert tb.optical.wavelengths() == [1565.941, 1546.5377]
        assert tb.optical.tuning_time_ns == 10.5
        assert tb.optical.line_rate_gbps == 100
    if name == "grid-4096":
        assert (tb.grid.rows, len(tb.wss), tb.wss[0].ports) == (64, 128, 64)
    if name == "grid-1024":
        assert (tb.grid.rows, len(tb.wss), tb.wss[0].ports) == (32, 64, 32)
    if name == "grid-64":
        assert (tb.grid.rows, len(tb.wss), tb.wss[0].ports) == (8, 16, 8)


def test_wavelength_grid_is_itu_spaced(root: Path) -> None:
    wl = load_testbed(root / "hw_configs" / "grid-4096.toml").optical.wavelengths()
    f = [299_792.458 / x for x in wl]
    assert all(abs((f[i] - f[i + 1]) - 0.05) < 1e-4 for i in range(len(f) - 1))


BROKEN = {
    "grid shape": (PROTO.replace("cols = 4", "cols = 5").format(nodes=four(), ports=5),
                   "nodes", "grid is 1 x 5 = 5 cells but 4 nodes are listed"),
    "outside grid": (PROTO.format(nodes=four(cols=(0, 1, 2, 7)), ports=4),
                     "nodes[3]", "outside the 1 x 4 grid"),
    "shared cell": (PROTO.format(nodes=four(cols=(0, 1, 2, 2)), ports=4),
                    "nodes[3]", "shares cell (0, 2)"),
    "duplicate node id": (PROTO.format(nodes=four(ids=("a", "b", "a", "d")), ports=4),
                          "nodes[2].id", "duplicate node id 'a'"),
    "wss ports": (PROTO.format(nodes=four(), ports=3),
                  "wss[0].ports", "3 ports cannot cover the 4 nodes of row 0"),
    "missing wss": (PROTO.format(nodes=four(), ports=4).replace('axis = "row"',
                                                                 'axis = "col"'),
                    "wss", "row 0 has 4 nodes but no WSS"),
    "wss index": (PROTO.format(nodes=four(), ports=4).replace("index = 0", "index = 3"),
                  "wss[0].index", "row 3 does not exist in the 1 x 4 grid"),
    "two wss on a row": (PROTO.format(nodes=four(), ports=4)
                         + '[[wss]]\nid = "w1"\naxis = "row"\nindex = 0\nports = 4\n',
                         "wss[1]", "row 0 has more than one WSS"),
    "duplicate wss id": (PROTO.format(nodes=four(), ports=4)
                         + '[[wss]]\nid = "w0"\naxis = "row"\nindex = 0\nports = 4\n',
                         "wss[1].id", "duplicate WSS id 'w0'"),
    "wavelength band": (PROTO.format(nodes=four(), ports=4).replace("1546.5377", "1310.0"),
                        "optical.wavelengths_nm[1]", "1310.0 nm is outside the C/L band"),
    "duplicate wavelength": (PROTO.format(nodes=four(), ports=4).replace("1546.5377",
                                                                          "1565.941"),
                             "optical.wavelengths_nm", "listed more than once"),
    "timing positive": (PROTO.format(nodes=four(), ports=4).replace("tuning_time_ns = 10.5",
                                                                     "tuning_time_ns = -1"),
                        "optical.tuning_time_ns", "greater than 0"),
    "latency positive": (PROTO.format(nodes=four(), ports=4).replace("latency_ns = 1000",
                                                                      "latency_ns = 0"),
                         "control.latency_ns", "greater than 0"),
    "unknown field": (PROTO.format(nodes=four(), ports=4).replace("[control]",
                                                                  "[control]\nlatncy_ns = 3"),
                      "control.latncy_ns", "Extra inputs are not permitted"),
    "wrong type": (PROTO.format(nodes=four(), ports=4).replace("rows = 1", 'rows = "one"'),
                   "grid.rows", "valid integer"),
    "bad toml": ("[grid\nrows = 1", "", "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_config_names_file_field_reason(tmp_path: Path, case: str) -> None:
    text, field, reason = BROKEN[case]
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_testbed(p)
    msgs = [str(i) for i in ei.value.issues]
    assert any(i.path == field and reason in i.reason for i in ei.value.issues), msgs
    assert all(m.startswith(str(p)) for m in msgs)


def test_check_cli_prints_every_error_and_exits_2(tmp_path: Path) -> None:
    text = PROTO.format(nodes=four(ids=("a", "a", "c", "d")), ports=3).replace("1546.5377",
                                                                               "1700")
    p = write(tmp_path, text)
    r = CliRunner().invoke(main, ["check", str(p)])
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 3, r.output
    assert f"{p}: nodes[1].id: duplicate node id 'a'" in r.output
    assert f"{p}: wss[0].ports:" in r.output
    assert f"{p}: optical.wavelengths_nm[1]: 1700.0 nm is outside" in r.output


def test_check_cli_ok(root: Path) -> None:
    r = CliRunner().invoke(main, ["check", str(root / "hw_configs" / "prototype-4node.toml")])
    assert r.exit_code == 0
    assert r.output.startswith("OK ")
    assert "4 nodes, 1 WSSs, 2 wavelengths" in r.output


SHIPPED = sorted((Path(__file__).parent.parent / d / f).relative_to(
    Path(__file__).parent.parent) for d in ("experiments", "hw_configs")
    for f in os.listdir(Path(__file__).parent.parent / d) if f.endswith(".toml"))


@pytest.mark.parametrize("config", SHIPPED, ids=str)
def test_every_shipped_config_passes_check(root: Path, config: Path) -> None:
    """Reproducer: `oddl check experiments/multijob-1024.toml` ended in a traceback
    (ValueError: several jobs, not one workload), and every sweep was refused."""
    r = CliRunner().invoke(main, ["check", str(root / config)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"OK {root / config}: "), r.output


def test_a_log_level_that_is_none_is_refused(root: Path) -> None:
    r = CliRunner().invoke(main, ["check", str(root / "hw_configs" / "prototype-4node.toml")],
                           env={"ODDL_LOG": "loud"})
    assert r.exit_code == 2
    assert "ODDL_LOG=loud: one of debug, info, warning, error" in r.output


def test_missing_file(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["check", str(tmp_path / "nope.toml")])
    assert r.exit_code == 2
    assert "nope.toml: file not found" in r.output


def test_experiment_errors_name_field(tmp_path: Path, root: Path) -> None:
    src = (root / "experiments" / "table1-resnet50.toml").read_text()
    bad = src.replace('collective = "hd"', 'collective = "tree"').replace(
        'testbed = "../hw_configs/prototype-4node.toml"',
        f'testbed = "{root / "hw_configs" / "prototype-4node.toml"}"')
    p = tmp_path / "e.toml"
    p.write_text(bad)
    with pytest.raises(ConfigError) as ei:
        load_experiment(p)
    assert ei.value.issues[0].path == "workload.collective"
    assert "'ring', 'hd', 'hier2d' or 'totientrings'" in ei.value.issues[0].reason


@pytest.mark.parametrize("broker,reason", [
    ('url = "mqtt://lab-broker"', "use 'embedded' or mqtt(s)://host:port"),
    ('url = "http://x:1"', "use 'embedded' or mqtt(s)://host:port"),
    ('url = "mqtts://x:8883"', "mqtts:// needs ca_file"),
    ('ca_file = "ca.pem"', "the embedded broker has no TLS"),
])
def test_broker_section_errors(tmp_path: Path, broker: str, reason: str) -> None:
    p = write(tmp_path, PROTO.format(nodes=four(), ports=4) + f"[broker]\n{broker}\n")
    with pytest.raises(ConfigError) as ei:
        load_testbed(p)
    assert any(i.path == "broker" and reason in i.reason for i in ei.value.issues), \
        [str(i) for i in ei.value.issues]


def test_broker_defaults_to_embedded_on_loopback(root: Path) -> None:
    b = load_testbed(root / "hw_configs" / "prototype-4node.toml").broker
    assert (b.url, b.bind) == ("embedded", "127.0.0.1")


def test_a_job_file_is_checked_as_a_job(root: Path, tmp_path: Path) -> None:
    """Reproducer (issue 43): `oddl check` took a job file (a [workload] without testbed or
    networks, what `oddl submit` takes) for a broken experiment."""
    r = CliRunner().invoke(main, ["check", str(root / "experiments" / "job-resnet50-16.toml")])
    assert r.exit_code == 0, r.output
    assert "a job for an arbiter (`oddl submit`): resnet50, ring, 16 ranks" in r.output
    bad = tmp_path / "j.toml"
    bad.write_text((root / "experiments" / "job-resnet50-16.toml").read_text().replace(
        "ranks = 16", "ranks = -3"))
    r = CliRunner().invoke(main, ["check", str(bad)])
    assert r.exit_code == 2 and f"{bad}: workload.ranks: " in r.output, r.output
