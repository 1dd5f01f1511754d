"""Configs and arguments that exhausted the machine, crashed, or were accepted but wrong
(issue 13): each is a clear error naming the file, the field and the reason, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from oddl.app.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROTO = (ROOT / "hw_configs" / "prototype-4node.toml").read_text()
TABLE1 = (ROOT / "experiments" / "table1-resnet50.toml").read_text()

# (name, testbed text, the field the error names, a piece of the reason)
TESTBEDS = [
    ("huge grid", PROTO.replace("rows = 1", "rows = 1000000000"), "grid.rows",
     "less than or equal to 65536"),
    ("grid over the node bound", PROTO.replace("rows = 1", "rows = 20000"), "grid",
     "at most 65536"),
    ("huge WSS", PROTO.replace("ports = 4", "ports = 1000000000000"), "wss[0].ports",
     "less than or equal to 4096"),
    ("4,301-digit number", PROTO.replace("rows = 1", "rows = " + "1" * 4301), "",
     "not a usable TOML value"),
    ("not UTF-8", PROTO.replace("ODDL 4-node", "ODDL \udcff4-node"), "", "not UTF-8"),
    ("generated ids without a field", PROTO + '\n[generate]\nnodes = "{x}"\n',
     "generate.nodes", "not a pattern"),
    ("generated ids from a positional", PROTO + '\n[generate]\nnodes = "{}"\n',
     "generate.nodes", "not a pattern"),
    ("generated ids unbalanced", PROTO + '\n[generate]\nnodes = "{"\n', "generate.nodes",
     "not a pattern"),
    ("generated ids all the same", PROTO + '\n[generate]\nnodes = "n{row}"\n',
     "generate.nodes", "both"),
    ("no wavelength", re.sub(r"wavelengths_nm = \[.*\]", "wavelengths_nm = []", PROTO),
     "optical.wavelengths_nm", "at least 1"),
    ("two nodes on one board", PROTO.replace('board = "onic1"', 'board = "onic0"'),
     "nodes[1].board", "n1 shares onic0 with nodes[0]"),
    ("node id with a topic wildcard", PROTO.replace('id = "n1"', 'id = "n#1"'), "nodes[1].id",
     "MQTT topic level"),
    ("node id with a level separator", PROTO.replace('id = "n1"', 'id = "n/1"'), "nodes[1].id",
     "MQTT topic level"),
    ("node named like a party", PROTO.replace('id = "n1"', 'id = "oddl-ctl"'), "nodes[1].id",
     "party on the control bus"),
    ("broker bind not an address", PROTO + '\n[broker]\nbind = "not an address"\n',
     "broker.bind", "not an IP address"),
    # issue 33, defect 15: passed check, and the run then called n1 dead
    ("propagation of seconds", PROTO.replace("propagation_ns = 50.0", "propagation_ns = 2.1e9"),
     "optical.propagation_ns", "less than or equal to 1000000"),
]


def _check(path: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["check", str(path)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


@pytest.mark.parametrize("name,text,field,why", TESTBEDS, ids=[t[0] for t in TESTBEDS])
def test_bad_testbed_is_named(tmp_path: Path, name: str, text: str, field: str,
                              why: str) -> None:
    p = tmp_path / "tb.toml"
    p.write_bytes(text.encode("utf-8", "surrogateescape"))
    code, out = _check(p)
    assert code == 2, out
    assert (f"{p}: {field}: " if field else f"{p}: ") in out and why in out, out


def test_two_wss_on_one_serial_port(tmp_path: Path) -> None:
    g = (ROOT / "hw_configs" / "grid-1024.toml").read_text()
    tb = tmp_path / "g.toml"
    wss = "".join(f'\n[[wss]]\nid = "{a[0]}{i}"\naxis = "{a}"\nindex = {i}\nports = 2\n'
                  + ('serial = "/dev/ttyUSB0"\n' if a == "row" else "")
                  for a in ("row", "col") for i in (0, 1))
    tb.write_text(g.replace("rows = 32", "rows = 2").replace("cols = 32", "cols = 2")
                  .replace("wss = true", "wss = false") + wss)
    code, out = _check(tb)
    assert code == 2 and "wss[1].serial: r1 shares /dev/ttyUSB0 with wss[0]" in out, out


@pytest.mark.parametrize("target,why", [("/dev/zero", "not a regular file"),
                                        ("", "at least 1 character"),
                                        ("missing.toml", "file not found")])
def test_experiment_testbed_that_is_no_file(tmp_path: Path, target: str, why: str) -> None:
    """Reproducer: `testbed = "/dev/zero"` read 1.9 GB; a directory or "" gave a traceback.
    The error names the experiment and its `testbed` field."""
    exp = tmp_path / "e.toml"
    exp.write_text(TABLE1.replace('testbed = "../hw_configs/prototype-4node.toml"',
                                  f'testbed = "{target}"'))
    code, out = _check(exp)
    assert code == 2 and f"{exp}: testbed: " in out and why in out, out


def test_experiment_testbed_resolves_against_its_own_directory(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Reproducer: a `testbed =` path that did not exist beside the experiment was looked
    up in the current directory instead."""
    (tmp_path / "tb.toml").write_text(PROTO)
    (tmp_path / "sub").mkdir()
    exp = tmp_path / "sub" / "e.toml"
    exp.write_text(TABLE1.replace('testbed = "../hw_configs/prototype-4node.toml"',
                                  'testbed = "tb.toml"'))
    monkeypatch.chdir(tmp_path)  # tb.toml is here, not beside the experiment
    code, out = _check(exp)
    assert code == 2 and f"{exp}: testbed: " in out and "file not found" in out, out


@pytest.mark.parametrize("change,field,why", [
    (("epochs = 20", "epochs = inf"), "workload.epochs", "finite number"),
    (("training_time_min = 97.3", "training_time_min = 1e300"),
     "workload.calibrate.training_time_min", "less than or equal to"),
    (('name = "table1-resnet50"', 'name = "../../x"'), "name", "should match pattern"),
    (("oddl_min = 97.8", "oddl_min = nan"), "reference",  # issue 33, defect 15
     "oddl_min = nan: a paper's figure is a finite number"),
])
def test_bad_experiment_is_named(tmp_path: Path, change: tuple[str, str], field: str,
                                 why: str) -> None:
    exp = tmp_path / "e.toml"
    exp.write_text(TABLE1.replace(*change).replace(
        'testbed = "../hw_configs/prototype-4node.toml"',
        f'testbed = "{ROOT / "hw_configs" / "prototype-4node.toml"}"'))
    code, out = _check(exp)
    assert code == 2 and f"{exp}: {field}: " in out and why in out, out
    assert out.count(why) == 1  # said once, though both networks would run it


def test_one_wavelength_too_few_for_the_plan_is_caught_by_check(tmp_path: Path) -> None:
    """Reproducer: check said OK, then run raised PlanError with a traceback."""
    tb = tmp_path / "tb.toml"
    tb.write_text(re.sub(r"wavelengths_nm = \[.*\]", "wavelengths_nm = [1550.12]", PROTO))
    exp = tmp_path / "e.toml"
    exp.write_text(TABLE1.replace('testbed = "../hw_configs/prototype-4node.toml"',
                                  'testbed = "tb.toml"'))
    code, out = _check(exp)
    assert code == 2 and f"{exp}: networks[0]: cannot be planned" in out, out
    r = CliRunner().invoke(main, ["run", str(exp), "--iterations", "1", "--out",
                                  str(tmp_path / "run")])
    assert r.exit_code == 2 and "cannot be planned" in r.output and r.exception is not None
    assert isinstance(r.exception, SystemExit)


def test_a_testbed_checked_alone_is_planned_as_oddl_plan_would(tmp_path: Path) -> None:
    """Reproducer (issue 33, defect 15): the one-wavelength testbed passed `check` alone
    (only an experiment on it was planned)."""
    tb = tmp_path / "tb.toml"
    tb.write_text(re.sub(r"wavelengths_nm = \[.*\]", "wavelengths_nm = [1550.12]", PROTO))
    code, out = _check(tb)
    assert code == 2 and f"{tb}: optical: the default job (halving-doubling over every " \
        "node, as `oddl plan` plans it) cannot be planned with 1 wavelength: n0 -> n2" in out, out


def test_a_sweep_given_to_run_points_to_sweep_and_check_validates_it(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["run", str(ROOT / "experiments" / "scaling-sweep.toml")])
    assert r.exit_code == 2 and "this is a sweep: run it with `oddl sweep`" in r.output, \
        r.output
    r = CliRunner().invoke(main, ["check", str(ROOT / "experiments" / "scaling-sweep.toml")])
    assert r.exit_code == 0 and "sweep scaling-sweep" in r.output, r.output
    bad = tmp_path / "s.toml"
    bad.write_text((ROOT / "experiments" / "scaling-sweep.toml").read_text().replace(
        "../hw_configs/", str(ROOT / "hw_configs") + "/").replace("nodes = [", "nodes = [3, "))
    r = CliRunner().invoke(main, ["check", str(bad)])
    assert r.exit_code == 2 and f"{bad}: " in r.output, r.output
    assert "node count 3: a power of two" in r.output, r.output


@pytest.mark.parametrize("n", ["0", "-1"])
def test_iterations_must_be_positive(n: str, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["run", str(ROOT / "experiments" / "table1-resnet50.toml"),
                                  "--iterations", n, "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "--iterations" in r.output
    assert not (tmp_path / "r").exists()  # refused before anything ran


def test_out_that_is_a_file_or_missing_dir(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    r = CliRunner().invoke(main, ["run", str(ROOT / "experiments" / "table1-resnet50.toml"),
                                  "--iterations", "1", "--out", str(f)])
    assert r.exit_code == 2 and "is a file" in r.output
    r = CliRunner().invoke(main, ["emulate", str(ROOT / "hw_configs" / "prototype-4node.toml"),
                                  "--out", str(tmp_path / "no" / "such" / "emu.toml")])
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.mark.parametrize("value", ["²", "1e3", "-1", "9" * 40])
def test_count_action_param_must_be_a_plain_integer(tmp_path: Path, value: str) -> None:
    r = CliRunner().invoke(main, ["countaction", "check", str(ROOT / "fpga" / "programs" /
                                                              "synchronized_data_streamer.ca"),
                                  "--param", f"num_DACs={value}"])
    assert r.exit_code == 2 and "NAME=INTEGER" in r.output, r.output


def test_count_action_range_is_bounded_before_it_is_expanded(tmp_path: Path) -> None:
    """Reproducer: `(i = 1 to 100000000)` took 67 s and 3.9 GB, then MemoryError."""
    p = tmp_path / "big.ca"
    p.write_text((ROOT / "fpga" / "programs" / "synchronized_data_streamer.ca").read_text()
                 .replace("param num_DACs = 2;", "param num_DACs = 100000000;"))
    r = CliRunner().invoke(main, ["countaction", "check", str(p)])
    assert r.exit_code == 2 and "at most 4096" in r.output, r.output


@pytest.mark.realtime
def test_run_against_a_testbed_that_is_gone_is_an_error_not_a_traceback(tmp_path: Path
                                                                         ) -> None:
    """Reproducer: `oddl run` gave a traceback on a killed emulator (its boards gone)."""
    from oddl.sim.devices.broker import free_port

    tb = tmp_path / "gone.toml"
    text = PROTO.replace('backend = "sim"', 'backend = "hw"')
    for i in range(4):  # nobody listens on these ports any more
        text = text.replace(f'board = "onic{i}"', f'board = "grpc://127.0.0.1:{free_port()}"')
    tb.write_text(text)
    r = CliRunner().invoke(main, ["run", str(ROOT / "experiments" / "table1-resnet50.toml"),
                                  "--backend", "hw", "--testbed", str(tb), "--iterations", "1",
                                  "--out", str(tmp_path / "run")])
    assert r.exit_code == 1 and "error: run failed:" in r.output, r.output
    assert isinstance(r.exception, SystemExit)


@pytest.mark.parametrize(("change", "field", "why"), [
    (('collective = "hd"', 'collective = "ring"'), "workload.collective",
     "ring on 4096 ranks is 33,546,240 flows an iteration, more than 4,000,000"),
    (('strategy = "matched"', 'strategy = "matched"\ncollective = "totientrings"'),
     "networks[0].collective", "totientrings on 4096 ranks is 134,184,960 flows"),
])
def test_a_run_too_big_to_hold_is_refused_by_check_up_front(tmp_path: Path, change: tuple,
                                                            field: str, why: str) -> None:
    """Reproducer (issue 33, defect 6): `oddl check` of the grid-4096 experiment with a ring
    took 110 s and 8.2 GB (totientrings over 120 s and 11 GB), building what the run
    would hold. A ring's flows grow as n^2: the estimate refuses it at once, naming why."""
    exp = tmp_path / "e.toml"
    exp.write_text((ROOT / "experiments" / "grid4096-resnet50-hd.toml").read_text()
                   .replace(*change).replace('testbed = "../hw_configs/grid-4096.toml"',
                                             f'testbed = "{ROOT / "hw_configs/grid-4096.toml"}"'))
    code, out = _check(exp)
    assert code == 2 and f"{exp}: {field}: " in out and why in out, out
    assert out.count(why) == 1  # said once, though both networks would run it


GPT = """name = "g"
testbed = "{tb}"
iterations = 2
[workload]
model = "gpt2"
collective = "ring"
epochs = 1
dataset_samples = 1000
parallelism = {{ data = 16, tensor = 2, pipeline = 2, gpu_tflops = {tflops} }}
[[networks]]
name = "oddl"
kind = "oddl"
{more}"""


@pytest.mark.parametrize("tflops", ["1e-300", "1e-9"])
def test_a_compute_rate_in_the_wrong_unit_is_named_by_check(tmp_path: Path, tflops: str
                                                            ) -> None:
    """Reproducer (issue 43): `gpu_tflops = 1e-300` was an OverflowError traceback in
    check; 1e-9 passed check, then the run failed "stalled ... 0 flows undelivered"."""
    exp = tmp_path / "g.toml"
    exp.write_text(GPT.format(tb=ROOT / "hw_configs" / "grid-64.toml", tflops=tflops,
                              more=""))
    code, out = _check(exp)
    assert code == 2, out
    assert f"{exp}: workload.parallelism.gpu_tflops: at {float(tflops):g} TFLOP/s a rank " \
        "computes for" in out and "more than a day" in out, out


def test_a_compute_step_longer_than_the_grace_is_no_stall(tmp_path: Path) -> None:
    """Reproducer (issue 43): a hybrid job's step computing longer than `grace_ms` (5 s) was
    taken for a stalled run. At 0.05 TFLOP/s gpt2's micro-batch steps take ~10 s each."""
    from oddl.app import api

    exp = tmp_path / "g.toml"
    exp.write_text(GPT.format(tb=ROOT / "hw_configs" / "grid-64.toml", tflops="0.05",
                              more="").replace("iterations = 2", "iterations = 1"))
    res = api.run(exp, iterations=1, say=lambda _line: None)
    assert res.networks["oddl"].iterations == 1 and res.invariant_violations == 0
    assert res.networks["oddl"].iteration_time_s > 10


def test_a_pipeline_stage_computing_several_steps_in_a_row_is_no_stall(tmp_path: Path
                                                                       ) -> None:
    """Reproducer (issue 62): `gpu_tflops = 0.001` passed check, then the run failed
    "stalled" after 70 s: the watch forgave one step's compute, but a pipeline stage
    computes several in a row with no message (a micro-batch's forward, then the next's).
    At 0.002 TFLOP/s, gpt2's steps compute ~40 s each, an iteration 20 min."""
    from oddl.app import api

    exp = tmp_path / "g.toml"
    exp.write_text(GPT.format(tb=ROOT / "hw_configs" / "prototype-4node.toml",
                              tflops="0.002", more="").replace(
        "data = 16, tensor = 2, pipeline = 2", "data = 1, tensor = 2, pipeline = 2"))
    res = api.run(exp, iterations=1, say=lambda _line: None)
    assert res.networks["oddl"].iterations == 1 and res.invariant_violations == 0
    assert res.networks["oddl"].iteration_time_s > 1000


def test_a_run_whose_simulated_compute_would_beat_for_hours_is_refused_up_front(
        tmp_path: Path) -> None:
    """Issue 62: in sim, every board beats every heartbeat_ms of simulated time; a slow
    GPU's hours of compute on a big grid are millions of beats, which the estimate now
    counts (before: the run went on for as long as they took)."""
    exp = tmp_path / "g.toml"
    exp.write_text(GPT.format(tb=ROOT / "hw_configs" / "grid-1024.toml", tflops="0.001",
                              more="").replace("data = 16,", "data = 256,").replace(
        "iterations = 2", "iterations = 10"))
    r = CliRunner().invoke(main, ["run", str(exp), "--no-plot", "--out",
                                  str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    assert "this run would take longer than an hour" in r.output and \
        "heartbeats over the simulated compute" in r.output, r.output


def test_verify_trace_beyond_this_process_memory_limit_is_refused_up_front(
        tmp_path: Path) -> None:
    """Reproducer (issue 62): under `ulimit -v 4000000`, `oddl verify trace` of a
    64,000-node grid ended in MemoryError at 3.7 GB: the estimate read the machine's free
    memory, not this process's limit. A 128 x 128 grid under a 3 GB limit here."""
    import resource
    import subprocess
    import sys

    tb = tmp_path / "g.toml"
    tb.write_text((ROOT / "hw_configs" / "grid-4096.toml").read_text().replace(
        "rows = 64", "rows = 128").replace("cols = 64", "cols = 128").replace(
        "spacing_ghz = 50, count = 64", "spacing_ghz = 25, count = 128"))
    exp = tmp_path / "e.toml"
    exp.write_text((ROOT / "experiments" / "grid4096-resnet50-hd.toml").read_text().replace(
        "../hw_configs/grid-4096.toml", str(tb)))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    r = subprocess.run([sys.executable, "-m", "oddl.app", "verify", "trace", str(exp)],
                       capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: this run would take more memory than the" in r.stderr, r.stderr[-2000:]
    assert "MemoryError" not in r.stderr and "Traceback" not in r.stderr


def test_an_mltcp_intercept_that_overflows_the_rates_is_refused(tmp_path: Path) -> None:
    """Reproducer (issue 43): `mltcp_slope = 100, mltcp_intercept = 1e-300` passed check,
    then the run died with an OverflowError."""
    exp = tmp_path / "e.toml"
    exp.write_text((ROOT / "experiments" / "cassini-fattree.toml").read_text().replace(
        'sharing = "mltcp"', 'sharing = "mltcp"\nmltcp_slope = 100\nmltcp_intercept = 1e-300',
        1).replace("../hw_configs/", str(ROOT / "hw_configs") + "/").replace(
        "cassini-fattree-trace.csv", str(ROOT / "experiments" / "cassini-fattree-trace.csv")))
    code, out = _check(exp)
    assert code == 2 and "mltcp_intercept: Input should be greater than or equal to 0.001" \
        in out, out


def test_a_testbed_given_to_run_is_named_as_one(tmp_path: Path) -> None:
    """Reproducer (issue 43): `oddl run TESTBED` printed 9 pydantic lines."""
    tb = ROOT / "hw_configs" / "prototype-4node.toml"
    r = CliRunner().invoke(main, ["run", str(tb)])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == f"error: {tb}: this is a testbed, not an experiment " \
        "(`oddl check` checks either; experiments/ has experiments to run on it)"


@pytest.mark.parametrize("out", ["/dev/null", "/proc/1", "dangling"])
def test_gateware_verilog_into_no_directory_is_one_line(tmp_path: Path, out: str) -> None:
    """Reproducer (issue 43): --out /dev/null, /proc/1 or a dangling symlink: tracebacks."""
    if out == "dangling":
        out = str(tmp_path / "link")
        Path(out).symlink_to(tmp_path / "gone")
    r = CliRunner().invoke(main, ["gateware", "verilog", "--out", out])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reproducer (issue 43): `oddl gateware synth` without [gateware] was a raw
    "No module named 'amaranth'" traceback. (None in sys.modules: the import fails as if
    the package were not installed.)"""
    import sys

    monkeypatch.setitem(sys.modules, "amaranth", None)
    for args in (["gateware", "synth"],
                 ["run", str(ROOT / "experiments" / "table1-resnet50.toml"), "--board-model",
                  "rtl"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, r.output
        assert 'which is not installed: pip install "oddl[gateware]"' in r.output, r.output
