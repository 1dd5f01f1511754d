"""The count-action language (Lightning, seeds/003): count events; when the count reaches
the target, fire the actions.

    module synchronized_data_streamer {
        counts:  { sum DAC[i].valid (i = 1 to num_DACs) }
        targets: { num_DACs }
        actions: { stream DAC[i].data (i = 1 to num_DACs) }
    };

A program is a list of modules; each compiles to one count-action engine slot of the
O-NIC register map (fpga/regmap.py) and decompiles back to text. A name used as a value
(`num_DACs`) is a parameter: the caller binds it (`--param`, or the target board's own
count of DACs), or else the program's `param NAME = VALUE;` default does. One bound by
neither is free: `parse_template` reports it, `parse` refuses it by name. The values a
program was compiled with travel in its image, so it decompiles to text that compiles
again unchanged. DACs are numbered from 1, as the talk numbers them.

Signals (what a count sums):
    rx[P].bytes [(src = NODE)]      bytes received on port P (H or V), optionally from NODE
    rx[P].transfers [(src = NODE)]  transfers received on port P
    rx[any].delivered (step = S)    bytes delivered to this node (final leg) for collective
                                    step S, on either port
    tx[P].done                      transfers sent on port P
    DAC[i].valid                    DAC i's valid flag (Lightning)
    module[NAME].fired              another module fired
Actions:
    tune tx[P] channel K            tune port P's transmitter to channel K (onic_top: only
                                    set TX_CHANNEL; the control unit tunes as routed)
    start tx[P]                     start the transfer preloaded in port P's transfer engine
                                    (onic_top: hand it to the control unit as a flow)
    stream DAC[i].data              stream DAC i's data into the photonic core (Lightning)
    irq                             interrupt the host
    arm module[NAME] / reset module[NAME]
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

from oddl.fpga import regmap as R

SIGNALS = {("rx", "bytes"): 1, ("rx", "transfers"): 2, ("tx", "done"): 3,
           ("DAC", "valid"): 4, ("module", "fired"): 5, ("rx", "delivered"): 6}


ANY_PORT = "any"  # rx[any]: either optical port


SIGNAL_NAMES = {v: k for k, v in SIGNALS.items()}


ACTIONS = {"tune": 1, "start": 2, "stream": 3, "irq": 4, "arm": 5, "reset": 6}


ACTION_NAMES = {v: k for k, v in ACTIONS.items()}


N_DACS = 8  # DAC valid/data lines into the engine, DAC[1] .. DAC[8]


MAX_TARGET = 2**32 - 1


MAX_RANGE = 4096


MAX_PARAMS = 64


MAX_PROGRAM_CHARS = 256 * 1024  # the shipped streamer is 1.6 kB; 16 modules with comments


PLACEHOLDER = 1  # a free parameter's value while a program is only checked: valid anywhere


class CountActionError(Exception):
    def __init__(self, msg: str, line: int = 0, col: int = 0, source: str = "<program>") -> None:
        self.msg, self.line, self.col, self.source = msg, line, col, source
        where = f"{source}:{line}:{col}: " if line else f"{source}: "
        super().__init__(where + msg)


@dataclass(frozen=True)
class Source:
    signal: str  # "rx.bytes", "DAC.valid", ...
    index: int | str  # port name, DAC number or module name
    src_node: int | None = None  # for rx.delivered: the step number
    pos: tuple[int, int] = field(default=(0, 0), compare=False)  # line, column in the text

    def text(self) -> str:
        kind, fld = self.signal.split(".")
        key = "step" if self.signal == "rx.delivered" else "src"
        f = f" ({key} = {self.src_node})" if self.src_node is not None else ""
        return f"sum {kind}[{self.index}].{fld}{f}"


@dataclass(frozen=True)
class Action:
    name: str
    index: int | str | None = None  # port, DAC or module
    arg: int | None = None  # channel for tune
    pos: tuple[int, int] = field(default=(0, 0), compare=False)

    def text(self) -> str:
        if self.name == "tune":
            return f"tune tx[{self.index}] channel {self.arg}"
        if self.name == "start":
            return f"start tx[{self.index}]"
        if self.name == "stream":
            return f"stream DAC[{self.index}].data"
        if self.name in ("arm", "reset"):
            return f"{self.name} module[{self.index}]"
        return "irq"


@dataclass
class Module:
    name: str
    counts: list[Source] = field(default_factory=list)
    target: int = 0
    actions: list[Action] = field(default_factory=list)
    auto_rearm: bool = False
    line: int = field(default=0, compare=False)

    def text(self) -> str:
        rearm = "    rearm\n" if self.auto_rearm else ""
        return (f"module {self.name} {{\n"
                f"    counts: {{\n" + "".join(f"        {s.text()}\n" for s in self.counts)
                + "    }\n    targets: {\n" + f"        {self.target}\n    }}\n"
                + "    actions: {\n" + "".join(f"        {a.text()}\n" for a in self.actions)
                + "    }\n" + rearm + "};\n")


@dataclass
class Program:
    modules: list[Module] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)  # the values it was bound with

    def text(self) -> str:
        head = "".join(f"param {k} = {v};\n" for k, v in self.params.items())
        return head + "\n".join(m.text() for m in self.modules)

    # --- builder API --------------------------------------------------------------
    def module(self, name: str, target: int, auto_rearm: bool = False) -> ModuleBuilder:
        m = Module(name, target=target, auto_rearm=auto_rearm)
        self.modules.append(m)
        return ModuleBuilder(m)


class ModuleBuilder:
    def __init__(self, m: Module) -> None:
        self.m = m

    def count(self, signal: str, index: int | str, src_node: int | None = None
              ) -> ModuleBuilder:
        self.m.counts.append(Source(signal, index, src_node))
        return self

    def act(self, name: str, index: int | str | None = None, arg: int | None = None
            ) -> ModuleBuilder:
        self.m.actions.append(Action(name, index, arg))
        return self


# --- lexer / parser -----------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+) | (?P<nl>\n) | (?P<comment>//[^\n]*) |
    (?P<num>\d+) | (?P<ident>[A-Za-z_][A-Za-z_0-9]*) |
    (?P<punct>[{}\[\]().;:,=])
""", re.VERBOSE)


@dataclass(frozen=True)
class _Tok:
    kind: str
    value: str
    line: int
    col: int


def _lex(text: str, source: str) -> Iterator[_Tok]:
    line, col, pos = 1, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CountActionError(f"unexpected character {text[pos]!r}", line, col, source)
        kind = m.lastgroup or ""
        val = m.group()
        if kind == "nl":
            yield _Tok("sep", "\n", line, col)
            line, col = line + 1, 1
        elif kind not in ("ws", "comment"):
            yield _Tok(kind, val, line, col)
            col += len(val)
        else:
            col += len(val)
        pos = m.end()
    yield _Tok("eof", "", line, col)


class _Parser:
    def __init__(self, text: str, params: dict[str, int], source: str) -> None:
        self.toks = list(_lex(text, source))
        self.i = 0
        self.params = dict(params)
        self.given = dict(params)  # the caller's values win over a program's defaults
        self.declared: list[str] = []
        self.used: list[str] = []  # bound parameters the program reads, in order
        self.free: dict[str, _Tok] = {}  # unbound ones, where each is first used
        self.source = source

    def err(self, msg: str, t: _Tok | None = None) -> CountActionError:
        t = t or self.peek()
        return CountActionError(msg, t.line, t.col, self.source)

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def skip_sep(self) -> None:
        while self.peek().kind == "sep" or self.peek().value in (";", ","):
            self.i += 1

    def skip_nl(self) -> None:
        while self.peek().kind == "sep":
            self.i += 1

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, value: str) -> _Tok:
        self.skip_nl()
        t = self.next()
        if t.value != value:
            got = "end of file" if t.kind == "eof" else repr(t.value)
            raise self.err(f"expected {value!r}, got {got}", t)
        return t

    def ident(self, what: str) -> _Tok:
        self.skip_nl()
        t = self.next()
        if t.kind != "ident":
            raise self.err(f"expected {what}, got {t.value or 'end of file'!r}", t)
        return t

    def value(self, env: dict[str, int]) -> int:
        self.skip_nl()
        t = self.next()
        if t.kind == "num":
            if len(t.value) > len(str(MAX_TARGET)):  # before int(): 4,300 digits raise
                raise self.err(f"a number of {len(t.value)} digits: the engine's registers "
                               f"are 32-bit (at most {MAX_TARGET})", t)
            return int(t.value)
        if t.kind == "ident":
            if t.value in env:
                return env[t.value]
            if t.value in self.params:
                if t.value not in self.used:
                    self.used.append(t.value)
                return self.params[t.value]
            if len(self.free) >= MAX_PARAMS and t.value not in self.free:
                raise self.err(f"more than {MAX_PARAMS} parameters", t)
            self.free.setdefault(t.value, t)
            return PLACEHOLDER
        raise self.err(f"expected a number or parameter, got {t.value!r}", t)

    def program(self) -> Program:
        prog = Program()
        while True:
            self.skip_sep()
            t = self.peek()
            if t.kind == "eof":
                return prog
            if t.value == "param":
                self.next()
                name = self.ident("parameter name")
                if name.value in self.declared:
                    raise self.err(f"parameter {name.value!r} declared twice", name)
                if len(self.declared) >= MAX_PARAMS:
                    raise self.err(f"more than {MAX_PARAMS} parameters", name)
                self.expect("=")
                default = self.value({})
                self.declared.append(name.value)
                self.params[name.value] = self.given.get(name.value, default)
                continue
            if t.value != "module":
                raise self.err(f"expected 'module' or 'param', got {t.value!r}")
            prog.modules.append(self.module())

    def module(self) -> Module:
        kw = self.next()
        name = self.ident("module name").value
        m = Module(name, line=kw.line)
        self.expect("{")
        seen: set[str] = set()
        while True:
            self.skip_sep()
            t = self.peek()
            if t.value == "}":
                self.next()
                break
            sec = self.ident("'counts', 'targets', 'actions' or 'rearm'")
            if sec.value == "rearm":
                m.auto_rearm = True
                continue
            if sec.value not in ("counts", "targets", "actions"):
                raise self.err(f"unknown section {sec.value!r} (counts, targets, actions)", sec)
            if sec.value in seen:
                raise self.err(f"section {sec.value!r} given twice", sec)
            seen.add(sec.value)
            self.expect(":")
            self.expect("{")
            getattr(self, "sec_" + sec.value)(m)
        missing = {"counts", "targets", "actions"} - seen
        if missing:
            raise self.err(f"module {name!r} lacks {', '.join(sorted(missing))}", kw)
        self.expect(";")
        return m

    def _items(self) -> Iterator[_Tok]:
        while True:
            self.skip_sep()
            t = self.peek()
            if t.value == "}":
                self.next()
                return
            if t.kind == "eof":
                raise self.err("unclosed '{'")
            yield t

    def _range(self) -> tuple[str, range] | None:
        """`(i = 1 to N)` after an item; None if absent."""
        save = self.i
        if self.peek().value != "(":
            return None
        self.next()
        var = self.ident("loop variable")
        if self.peek().value != "=":
            self.i = save
            return None
        self.next()
        free = len(self.free)
        lo = self.value({})
        to = self.ident("'to'")
        if to.value != "to":
            raise self.err("expected 'to' in a range", to)
        hi = self.value({})
        self.expect(")")
        if len(self.free) > free:  # a bound is free: one item, to check the item's text
            hi = lo
        if hi < lo:
            raise self.err(f"empty range {lo} to {hi}", var)
        if hi - lo >= MAX_RANGE:  # no engine has that many sources: refuse before expanding
            raise self.err(f"range {lo} to {hi} has {hi - lo + 1} items, at most {MAX_RANGE}",
                           var)
        return var.value, range(lo, hi + 1)

    def _ref(self, env: dict[str, int]) -> tuple[_Tok, str | int, str | None]:
        """NAME[index].field -> (name token, index, field or None)."""
        name = self.ident("a signal or device")
        self.expect("[")
        self.skip_nl()
        t = self.peek()
        if t.kind == "ident" and t.value in ("H", "V"):
            self.next()
            idx: str | int = t.value
        elif t.kind == "ident" and (name.value == "module"
                                    or (name.value == "rx" and t.value == ANY_PORT)):
            self.next()
            idx = t.value
        elif (t.kind == "ident" and name.value in ("rx", "tx") and t.value not in env
              and t.value not in self.params):
            raise self.err(f"port {t.value!r} is not H or V", t)
        else:
            idx = self.value(env)
        self.expect("]")
        fld = None
        if self.peek().value == ".":
            self.next()
            fld = self.ident("a field").value
        return name, idx, fld

    def _expand(self, parse_one) -> list:
        start = self.i
        items = [parse_one({})] if not self._peek_loop() else []
        if items:
            rng = self._range()
            if rng is None:
                return items
            raise self.err("a range needs the loop variable inside the item")
        # re-parse with each loop value
        self.i = start
        while self.toks[self.i].value != "(" or not self._is_range_at(self.i):
            self.i += 1
        range_start = self.i
        rng = self._range()
        assert rng is not None
        end = self.i
        out = []
        for v in rng[1]:
            self.i = start
            out.append(parse_one({rng[0]: v}))
            if self.i != range_start:
                raise self.err("unexpected text before the range")
        self.i = end
        return out

    def _is_range_at(self, i: int) -> bool:
        t = self.toks
        return (t[i].value == "(" and t[i + 1].kind == "ident" and t[i + 2].value == "="
                and t[i + 1].value not in ("src", "step"))

    def _peek_loop(self) -> bool:
        j = self.i
        while self.toks[j].kind not in ("sep", "eof") and self.toks[j].value not in (";", "}"):
            if self._is_range_at(j):
                return True
            j += 1
        return False

    def sec_counts(self, m: Module) -> None:
        for t in self._items():
            if t.value not in ("sum", "count"):
                raise self.err(f"a count starts with 'sum', got {t.value!r}", t)

            def one(env: dict[str, int]) -> Source:
                self.next()  # sum
                name, idx, fld = self._ref(env)
                sig = (name.value, fld or "")
                if sig not in SIGNALS:
                    known = ", ".join(f"{a}[..].{b}" for a, b in SIGNALS)
                    raise self.err(f"unknown signal {name.value}[..].{fld} (known: {known})",
                                   name)
                src = None
                if self.peek().value == "(" and self.toks[self.i + 1].value in ("src", "step"):
                    self.next()
                    key = self.next()
                    want = "step" if sig == ("rx", "delivered") else "src"
                    if key.value != want:
                        raise self.err(f"{name.value}[..].{fld} filters by {want!r}, not "
                                       f"{key.value!r}", key)
                    self.expect("=")
                    src = self.value(env)
                    self.expect(")")
                return Source(f"{sig[0]}.{sig[1]}", idx, src, (name.line, name.col))

            m.counts += self._expand(one)

    def sec_targets(self, m: Module) -> None:
        vals = []
        for t in self._items():
            vals.append((t, self.value({})))
        if len(vals) != 1:
            raise self.err(f"module {m.name!r}: exactly one target, got {len(vals)}")
        m.target = vals[0][1]
        m.line = m.line or vals[0][0].line

    def sec_actions(self, m: Module) -> None:
        for t in self._items():
            if t.value not in ACTIONS:
                raise self.err(f"unknown action {t.value!r} (known: {', '.join(ACTIONS)})", t)

            def one(env: dict[str, int]) -> Action:
                at = self.next()
                a = at.value
                if a == "irq":
                    return Action("irq", pos=(at.line, at.col))
                name, idx, fld = self._ref(env)
                if a == "tune":
                    if name.value != "tx":
                        raise self.err("tune takes tx[H] or tx[V]", name)
                    kw = self.ident("'channel'")
                    if kw.value != "channel":
                        raise self.err("expected 'channel'", kw)
                    return Action("tune", idx, self.value(env), (at.line, at.col))
                if a == "start":
                    if name.value != "tx":
                        raise self.err("start takes tx[H] or tx[V]", name)
                    return Action("start", idx, pos=(at.line, at.col))
                if a == "stream":
                    if name.value != "DAC" or fld != "data":
                        raise self.err("stream takes DAC[i].data", name)
                    return Action("stream", idx, pos=(at.line, at.col))
                if name.value != "module":
                    raise self.err(f"{a} takes module[NAME]", name)
                return Action(a, idx, pos=(at.line, at.col))

            m.actions += self._expand(one)


def _parse(text: str, params: dict[str, int] | None, source: str
           ) -> tuple[Program, dict[str, _Tok]]:
    if len(text) > MAX_PROGRAM_CHARS:  # before a token is made (10 MB took 23 s)
        raise CountActionError(f"{len(text):,} characters: a program is at most "
                               f"{MAX_PROGRAM_CHARS:,} (the engine holds {R.N_MODULES} "
                               f"modules)", source=source)
    p = _Parser(text, params or {}, source)
    prog = p.program()
    unknown = [k for k in p.given if k not in p.declared and k not in p.used]
    if unknown:
        has = ", ".join(dict.fromkeys([*p.declared, *p.used, *p.free])) or "none"
        raise CountActionError(f"no parameter {', '.join(map(repr, unknown))} in this "
                               f"program (its parameters: {has})", source=source)
    check(prog, source)
    if not p.free:
        prog.params = {k: p.params[k] for k in dict.fromkeys([*p.declared, *p.used])}
    return prog, p.free


def parse_template(text: str, params: dict[str, int] | None = None,
                   source: str = "<program>") -> tuple[Program, list[str]]:
    """Parse and check a program that may leave parameters free: the program (each free
    parameter at a placeholder, and then no bound values) and the free parameters' names,
    in order of first use."""
    prog, free = _parse(text, params, source)
    return prog, list(free)


def parse(text: str, params: dict[str, int] | None = None, source: str = "<program>"
          ) -> Program:
    """A program with every parameter bound; unbound ones are an error naming them all,
    at the first one's first use."""
    prog, free = _parse(text, params, source)
    if free:
        names, t = list(free), next(iter(free.values()))
        many = len(names) > 1
        raise CountActionError(
            f"unbound parameter{'s' if many else ''} {', '.join(names)}: give "
            f"{'each' if many else 'it'} with --param NAME=VALUE or 'param NAME = VALUE;', "
            f"or bind it from the target board (compile --testbed)", t.line, t.col, source)
    return prog


def check(prog: Program, source: str = "<program>") -> None:
    """Semantic checks: what the engine can hold and what its signals and actions accept."""
    names = [m.name for m in prog.modules]
    if len(prog.modules) > R.N_MODULES:
        raise CountActionError(f"{len(prog.modules)} modules, the engine has {R.N_MODULES}",
                               prog.modules[R.N_MODULES].line, 1, source)
    for m in prog.modules:
        def bad(msg: str, m: Module = m, pos: tuple[int, int] | None = None
                ) -> CountActionError:
            line, col = pos if pos and pos[0] else (m.line, 1)
            return CountActionError(f"module {m.name!r}: {msg}", line, col, source)
        if names.count(m.name) > 1:
            raise bad("defined twice")
        if not 0 < m.target <= MAX_TARGET:
            raise bad(f"target {m.target} out of range (1 to {MAX_TARGET})")
        if len(m.counts) > R.N_SLOTS or len(m.actions) > R.N_SLOTS:
            raise bad(f"{len(m.counts)} counts / {len(m.actions)} actions; a module holds "
                      f"{R.N_SLOTS} of each")
        if not m.counts:
            raise bad("counts nothing")
        for s in m.counts:
            kind = s.signal.split(".")[0]
            if (s.signal.split(".")[0], s.signal.split(".")[1]) not in SIGNALS:
                raise bad(f"unknown signal {s.signal}", pos=s.pos)
            ports = (*R.PORTS, ANY_PORT) if s.signal == "rx.delivered" else R.PORTS
            if kind in ("rx", "tx") and s.index not in ports:
                raise bad(f"{s.signal}: port {s.index!r} is not {' or '.join(ports)}",
                          pos=s.pos)
            if s.signal == "rx.delivered" and s.src_node is None:
                raise bad("rx[..].delivered needs (step = S)", pos=s.pos)
            if kind == "DAC" and not (isinstance(s.index, int) and 1 <= s.index <= N_DACS):
                raise bad(f"DAC index {s.index} out of range (1 to {N_DACS})", pos=s.pos)
            if kind == "module" and s.index not in names:
                raise bad(f"counts module {s.index!r}, which is not defined", pos=s.pos)
            if s.src_node is not None and not 0 <= s.src_node < 0xFFFF:
                raise bad(f"src node {s.src_node} out of range", pos=s.pos)
        for a in m.actions:
            if a.name not in ACTIONS:
                raise bad(f"unknown action {a.name!r}", pos=a.pos)
            if a.name in ("tune", "start") and a.index not in R.PORTS:
                raise bad(f"{a.name}: port {a.index!r} is not H or V", pos=a.pos)
            if a.name == "tune" and not (a.arg is not None and 0 <= a.arg < R.N_CHANNELS):
                raise bad(f"tune: channel {a.arg} out of range (0 to {R.N_CHANNELS - 1})",
                          pos=a.pos)
            if a.name == "stream" and not (isinstance(a.index, int) and 1 <= a.index <= N_DACS):
                raise bad(f"stream: DAC index {a.index} out of range (1 to {N_DACS})",
                          pos=a.pos)
            if a.name in ("arm", "reset") and a.index not in names:
                raise bad(f"{a.name}: module {a.index!r} is not defined", pos=a.pos)


# --- built-in programs --------------------------------------------------------------------

PROGRAMS = Path(__file__).resolve().parent / "programs"


def builtin(name: str) -> tuple[str, str]:
    """A shipped program's text and its path (fpga/programs/NAME.ca)."""
    path = PROGRAMS / f"{name}.ca"
    return path.read_text(), str(path)


def streamer(num_dacs: int = 2) -> Program:
    """Lightning's synchronized data streamer (seeds/003), as the talk prints it."""
    text, path = builtin("synchronized_data_streamer")
    return parse(text, {"num_DACs": num_dacs}, path)


def inference_dag(layer_words: list[int], num_dacs: int = 4) -> Program:
    """Lightning's inference as count-action (seeds/003, studies/lenet.py): `stream`, the
    synchronized streamer, admits a word once every DAC's valid flag is counted; `layerK`
    counts the words streamed, to the words of layers 1..K (every layer counts from the
    start, so no module waits to be armed), and fires when layer K is done: the
    electronics integrate, ReLU and renormalise on its interrupt; `argmax` follows the last
    layer and resets the layers, `rearm` arms them again for the next inference."""
    if not 0 < len(layer_words) < R.N_SLOTS or min(layer_words) < 1:
        raise CountActionError(f"layers {layer_words}: 1 to {R.N_SLOTS - 1}, each of "
                               "at least one word")
    prog = Program()
    s = prog.module("stream", num_dacs, auto_rearm=True)
    for d in range(1, num_dacs + 1):
        s.count("DAC.valid", d).act("stream", d)
    names = [f"layer{k}" for k in range(1, len(layer_words) + 1)]
    for name, total in zip(names, accumulate(layer_words), strict=True):
        prog.module(name, total).count("module.fired", "stream").act("irq")
    argmax = prog.module("argmax", 1, auto_rearm=True).count("module.fired", names[-1])
    argmax.act("irq")
    rearm = prog.module("rearm", 1, auto_rearm=True).count("module.fired", "argmax")
    for name in names:
        argmax.act("reset", name)
        rearm.act("arm", name)
    check(prog)
    return prog


def step_sync(step_bytes: list[int]) -> Program:
    """Collective step synchronisation, loaded once per job: module k counts the bytes
    delivered to this node for step k (either port) and interrupts the host when the step's
    inputs are complete; it re-arms itself for the next iteration."""
    if len(step_bytes) > R.N_MODULES:
        raise CountActionError(f"{len(step_bytes)} steps, the engine has {R.N_MODULES} modules")
    prog = Program()
    for k, nbytes in enumerate(step_bytes):
        prog.module(f"step{k}", nbytes, auto_rearm=True).count("rx.delivered", ANY_PORT,
                                                               k).act("irq")
    check(prog)
    return prog


def collective_steps(steps: list[tuple[str, int, int, str | None, int | None]]) -> Program:
    """Step synchronisation: per step (port, partner node, bytes expected, next port, next
    channel): count bytes from the partner; at the chunk size, tune to the next step's
    channel and start the next transfer (preloaded by the host)."""
    prog = Program()
    for s, (port, partner, nbytes, nport, nch) in enumerate(steps):
        b = prog.module(f"step{s}", nbytes).count("rx.bytes", port, partner)
        if nport is not None and nch is not None:
            b.act("tune", nport, nch).act("start", nport)
        b.act("irq")
    check(prog)
    return prog
