"""The count-action language: parse, check, compile, decompile, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from oddl.app.cli import main
from oddl.fpga import regmap as R
from oddl.fpga.countaction import (
    CountActionError,
    Program,
    builtin,
    collective_steps,
    parse,
    parse_template,
    streamer,
)
from oddl.fpga.countaction_image import compile_program, decompile


def test_talk_streamer_parses_as_written() -> None:
    """The shipped .ca, with the caller's num_DACs over the file's default of 2."""
    p = parse(builtin("synchronized_data_streamer")[0], {"num_DACs": 3})
    (m,) = p.modules
    assert m.name == "synchronized_data_streamer"
    assert [(s.signal, s.index) for s in m.counts] == [("DAC.valid", i) for i in (1, 2, 3)]
    assert m.target == 3
    assert [(a.name, a.index) for a in m.actions] == [("stream", i) for i in (1, 2, 3)]


BAD = [
    ("module x { counts: { sum foo[H].bar } targets: { 1 } actions: { irq } };", 1, 26,
     "unknown signal foo"),
    ("module x {\n  counts: { sum rx[H].bytes }\n  targets: { 1 }\n"
     "  actions: { tune tx[H] channel 64 }\n};", 4, 14, "channel 64 out of range"),
    ("module x { counts: { sum rx[Q].bytes } targets: { 1 } actions: { irq } };", 1, 29,
     "port 'Q' is not H or V"),
    ("module x { counts: { sum rx[H].bytes } targets: { 0 } actions: { irq } };", 1, 1,
     "target 0 out of range"),
    ("module x { counts: { sum rx[H].bytes } targets: { 1 } actions: { jump } };", 1, 66,
     "unknown action 'jump'"),
    ("module x { counts: { sum DAC[i].valid (i = 1 to n) } targets: { 1 } actions: { irq } };",
     1, 49, "unbound parameter n: give it with --param NAME=VALUE"),
    ("module x { counts: { sum rx[H].bytes } targets: { 1 } actions: { irq } }", 1, 73,
     "expected ';'"),
    ("module x { counts: { sum rx[H].bytes } actions: { irq } };", 1, 1, "lacks targets"),
    ("module x { counts: { sum rx[H].bytes } targets: { 1 } actions: { arm module[y] } };",
     1, 66, "module 'y' is not defined"),
    ("modul x {};", 1, 1, "expected 'module' or 'param'"),
    ("module x { counts: { sum rx[H].bytes $ } };", 1, 38, "unexpected character '$'"),
    # issue 33: a literal over Python's 4,300-digit limit was a ValueError traceback
    ("module x { counts: { sum rx[H].bytes } targets: { " + "9" * 5000 + " } };", 1, 51,
     "a number of 5000 digits: the engine's registers are 32-bit"),
]


@pytest.mark.parametrize("text,line,col,msg", BAD)
def test_errors_give_line_and_column(text: str, line: int, col: int, msg: str) -> None:
    with pytest.raises(CountActionError) as ei:
        parse(text, source="p.ca")
    e = ei.value
    assert (e.line, e.col) == (line, col), str(e)
    assert msg in str(e)
    assert str(e).startswith(f"p.ca:{line}:{col}: ")


def test_too_many_modules() -> None:
    text = "".join(f"module m{i} {{ counts: {{ sum rx[H].bytes }} targets: {{ 1 }} "
                   f"actions: {{ irq }} }};\n" for i in range(R.N_MODULES + 1))
    with pytest.raises(CountActionError, match=f"{R.N_MODULES + 1} modules, the engine has"):
        parse(text)


names = st.sampled_from(["a", "b", "step0", "stream_x"])


@st.composite
def programs(draw: st.DrawFn) -> Program:
    mods = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    prog = Program()
    for name in mods:
        b = prog.module(name, draw(st.integers(1, 2**32 - 1)), draw(st.booleans()))
        for _ in range(draw(st.integers(1, R.N_SLOTS))):
            kind = draw(st.sampled_from(["rx.bytes", "rx.transfers", "tx.done", "DAC.valid",
                                         "module.fired", "rx.delivered"]))
            if kind == "rx.delivered":
                b.count(kind, draw(st.sampled_from(["H", "V", "any"])), draw(st.integers(0, 4000)))
            elif kind.startswith(("rx", "tx")):
                src = draw(st.none() | st.integers(0, 4000)) if kind.startswith("rx") else None
                b.count(kind, draw(st.sampled_from(["H", "V"])), src)
            elif kind == "DAC.valid":
                b.count(kind, draw(st.integers(1, 8)))
            else:
                b.count(kind, draw(st.sampled_from(mods)))
        for _ in range(draw(st.integers(0, R.N_SLOTS))):
            a = draw(st.sampled_from(["tune", "start", "stream", "irq", "arm", "reset"]))
            if a == "tune":
                b.act(a, draw(st.sampled_from(["H", "V"])), draw(st.integers(0, 63)))
            elif a == "start":
                b.act(a, draw(st.sampled_from(["H", "V"])))
            elif a == "stream":
                b.act(a, draw(st.integers(1, 8)))
            elif a == "irq":
                b.act(a)
            else:
                b.act(a, draw(st.sampled_from(mods)))
    return prog


@settings(max_examples=150, deadline=None)
@given(programs())
def test_round_trip(prog: Program) -> None:
    text = prog.text()
    again = parse(text)
    assert again.modules == prog.modules
    image = compile_program(again)
    back = decompile(json.loads(json.dumps(image)))
    assert back.modules == prog.modules
    assert back.text() == text


def test_collective_step_program() -> None:
    p = collective_steps([("H", 1, 1000, "H", 1), ("H", 2, 500, None, None)])
    img = compile_program(p)
    r0 = img["modules"][0]["registers"]
    assert r0["TARGET"] == 1000
    assert r0["SRC0"] == 1 | (0 << 8) | ((1 + 1) << 16)  # rx bytes, port H, from node 1
    assert r0["ACT0"] == 1 | (0 << 8) | (1 << 16)  # tune H to channel 1
    assert r0["ACT1"] == 2  # start H
    assert streamer(2).modules[0].target == 2


def test_cli(tmp_path: Path, root: Path) -> None:
    f = root / "fpga" / "programs" / "synchronized_data_streamer.ca"
    r = CliRunner().invoke(main, ["countaction", "check", str(f)])
    assert r.exit_code == 0 and "1 module (synchronized_data_streamer); bound: num_DACs = 2" \
        in r.output
    r = CliRunner().invoke(main, ["countaction", "compile", str(f), "--json"])
    assert r.exit_code == 0
    img = tmp_path / "img.json"
    img.write_text(r.output)
    r = CliRunner().invoke(main, ["countaction", "decompile", str(img)])
    assert r.exit_code == 0
    assert parse(r.output).modules == parse(f.read_text()).modules
    r = CliRunner().invoke(main, ["countaction", "compile", str(f)])
    assert "0x400C CA0_TARGET     0x00000002" in r.output
    bad = tmp_path / "bad.ca"
    bad.write_text("module x {\n counts: { sum rx[H].bytes }\n targets: { 1 }\n"
                   " actions: { start tx[Z] }\n};\n")
    r = CliRunner().invoke(main, ["countaction", "check", str(bad)])
    assert r.exit_code == 2
    assert f"error: {bad}:4:22: port 'Z' is not H or V" in r.output


def test_talk_text_verbatim_has_a_free_parameter(root: Path) -> None:
    """The talk's streamer pasted as printed (seeds/003, trailing spaces and all): no
    `param` line, so num_DACs is free; checked, and refused unbound, by name."""
    f = root / "tests" / "data" / "talk_synchronized_data_streamer.ca"
    prog, free = parse_template(f.read_text(), source=str(f))
    assert free == ["num_DACs"] and prog.params == {}
    with pytest.raises(CountActionError) as ei:
        parse(f.read_text(), source=str(f))
    assert (ei.value.line, ei.value.col) == (4, 36)
    assert "unbound parameter num_DACs" in str(ei.value)
    bound = parse(f.read_text(), {"num_DACs": 3})
    assert bound.params == {"num_DACs": 3} and bound.modules[0].target == 3
    assert [s.index for s in bound.modules[0].counts] == [1, 2, 3]  # DACs from 1, as printed


def test_every_unbound_parameter_is_named() -> None:
    text = ("module x { counts: { sum DAC[i].valid (i = lo to hi) } targets: { t }\n"
            " actions: { irq } };")
    assert parse_template(text)[1] == ["lo", "hi", "t"]
    with pytest.raises(CountActionError, match=r":1:44: unbound parameters lo, hi, t: give "
                                               "each with --param"):
        parse(text)
    with pytest.raises(CountActionError, match=r"unbound parameter t: give it"):
        parse(text, {"lo": 1, "hi": 2})
    with pytest.raises(CountActionError, match=r"no parameter 'x' in this program \(its "
                                               r"parameters: lo, hi, t\)"):
        parse(text, {"x": 1})


def test_bound_values_travel_in_the_image() -> None:
    prog = parse("param n = 2;\nmodule s { counts: { sum DAC[i].valid (i = 1 to n) }\n"
                 " targets: { n } actions: { irq } };", {"n": 4})
    img = compile_program(prog)
    assert img["params"] == {"n": 4}
    text = decompile(json.loads(json.dumps(img))).text()
    assert text.startswith("param n = 4;\n")
    assert compile_program(parse(text)) == img  # round trip, no params given
    for bad in ({"n": -1}, {"1n": 2}, {"n": True}, [1], {f"p{i}": 1 for i in range(65)}):
        with pytest.raises(CountActionError, match="image params"):
            decompile({**img, "params": bad})


def test_cli_binds_free_parameters(tmp_path: Path, root: Path) -> None:
    f = str(root / "tests" / "data" / "talk_synchronized_data_streamer.ca")
    run = CliRunner().invoke
    r = run(main, ["countaction", "check", f])
    assert r.exit_code == 0 and "free parameters: num_DACs" in r.output, r.output
    r = run(main, ["countaction", "compile", f])
    assert r.exit_code == 2 and "4:36: unbound parameter num_DACs" in r.output
    r = run(main, ["countaction", "compile", f, "--param", "num_DACs=3"])
    assert r.exit_code == 0 and "0x400C CA0_TARGET     0x00000003" in r.output
    # from the target board: the emulated QICK board of the testbed has two generators
    qick = str(root / "hw_configs" / "prototype-4node-qick.toml")
    r = run(main, ["countaction", "compile", f, "--testbed", qick, "--json"])
    assert r.exit_code == 0, r.output
    img = json.loads(r.output)
    assert img["params"] == {"num_DACs": 2} and img["modules"][0]["registers"]["TARGET"] == 2
    (tmp_path / "img.json").write_text(r.output)
    r = run(main, ["countaction", "decompile", str(tmp_path / "img.json")])
    (tmp_path / "back.ca").write_text(r.output)
    r = run(main, ["countaction", "compile", str(tmp_path / "back.ca"), "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == img
    r = run(main, ["countaction", "compile", f, "--testbed",
                   str(root / "hw_configs" / "prototype-4node.toml")])
    assert r.exit_code == 2 and "no [qick] board to take num_DACs from" in r.output


def test_regmap_doc_is_current(root: Path) -> None:
    assert (root / "docs" / "regmap.md").read_text() == R.markdown()
    offs = [r.offset for r in R.REGISTERS]
    assert len(offs) == len(set(offs))
    assert all(0 <= o < R.IP_RANGE and o % 4 == 0 for o in offs)
    assert max(offs) < R.ROUTE_BASE or min(o for o in offs if o >= R.CA_BASE) >= (
        R.ROUTE_BASE + 8 * R.ROUTE_ENTRIES)


def test_step_sync_program() -> None:
    from oddl.fpga.countaction import step_sync

    p = step_sync([100, 50])
    assert p.text().count("sum rx[any].delivered (step = ") == 2
    assert all(m.auto_rearm for m in p.modules)
    assert parse(p.text()).modules == p.modules
    with pytest.raises(CountActionError, match="filters by 'step', not 'src'"):
        parse("module x { counts: { sum rx[any].delivered (src = 1) } targets: { 1 } "
              "actions: { irq } };")
    with pytest.raises(CountActionError, match=r"needs \(step = S\)"):
        parse("module x { counts: { sum rx[any].delivered } targets: { 1 } actions: { irq } };")
    with pytest.raises(CountActionError, match="17 steps, the engine has 16"):
        step_sync([1] * 17)


_SRC = st.sampled_from([0, 0, 1, 1 | 1 << 8, 1 | 3 << 16])  # none, rx[H], rx[V], filtered
_ACT = st.sampled_from([0, 0, 5])  # none, irq


@st.composite
def images(draw: st.DrawFn) -> dict:
    """Register images as a fuzzer makes them: often valid, often not, sometimes hostile."""
    n = draw(st.integers(1, 3))
    mods = []
    for slot in range(n):
        regs = {"CTRL": draw(st.integers(0, 3)), "TARGET": draw(st.integers(1, 2**32 - 1))}
        for j in range(R.N_SLOTS):
            regs[f"SRC{j}"] = draw(_SRC)
            regs[f"ACT{j}"] = draw(_ACT)
        mods.append({"slot": draw(st.sampled_from([slot, slot, 99, -1])),
                     "name": draw(st.sampled_from([None, f"m{slot}", "a b", "", 5])),
                     "registers": regs if draw(st.booleans()) else regs | {
                         draw(st.sampled_from(["TARGET", "CTRL", "SRC0"])):
                         draw(st.sampled_from([2**32, 2**40, 7.5, "7", -1]))}})
    return {"design": R.DESIGN_NAME, "modules": mods}


@settings(max_examples=300, deadline=None)
@given(images())
def test_what_decompile_accepts_prints_as_text_that_parses_back(image: dict) -> None:
    """Reproducer (issue 33, defect 14): decompile took slot 99, values of 2^32 or floats
    and names such as "a b", 5 or "", and 125 of 237 fuzzed images it accepted did not
    survive decompile -> compile. Now an image it takes is one the engine could hold,
    and the text it prints parses back to the same registers."""
    try:
        prog = decompile(image)
    except CountActionError:
        return
    back = parse(prog.text(), dict(prog.params))  # `oddl countaction decompile` prints text
    assert compile_program(back)["modules"] == compile_program(prog)["modules"]


def test_a_program_is_bounded_before_it_is_read(tmp_path: Path) -> None:
    """Reproducer (issue 85): a 10 MB program was read and tokenized whole (22.7 s of CPU)
    before the engine's bounds refused it. Its size is refused first, by file and text."""
    from oddl.fpga.countaction import MAX_PROGRAM_CHARS, CountActionError, parse

    line = "module m target 1 { count rx.transfers on H }\n"
    with pytest.raises(CountActionError, match="a program is at most"):
        parse(line * (MAX_PROGRAM_CHARS // len(line) + 1))
    big = tmp_path / "big.ca"
    big.write_text(line * 250_000)  # 11.5 MB
    r = CliRunner().invoke(main, ["countaction", "check", str(big)])
    assert r.exit_code == 2 and "a program is at most" in r.output, r.output
