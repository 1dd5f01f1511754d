"""A count-action program as the O-NIC's engine holds it: compiled to a register image
(one engine slot a module, fpga/regmap.py), the image's register writes, and decompiled
back to the program (the values it was compiled with travel in the image, so it
decompiles to text that compiles again unchanged). The language is countaction.py's."""

from __future__ import annotations

import re
from typing import Any

from oddl.fpga import regmap as R
from oddl.fpga.countaction import (
    ACTION_NAMES,
    ACTIONS,
    ANY_PORT,
    MAX_PARAMS,
    MAX_TARGET,
    SIGNAL_NAMES,
    SIGNALS,
    Action,
    CountActionError,
    Module,
    Program,
    Source,
    check,
)

_REGISTERS = {"CTRL", "TARGET", *(f"{k}{j}" for k in ("SRC", "ACT") for j in range(R.N_SLOTS))}
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]{0,63}")  # what the language's parser takes


def _index_code(kind: str, idx: int | str, names: list[str]) -> int:
    if kind in ("rx", "tx"):
        return len(R.PORTS) if idx == ANY_PORT else R.PORTS.index(str(idx))
    if kind == "module":
        return names.index(str(idx))
    return int(idx)


def compile_program(prog: Program) -> dict:
    """Register image: per module the CA register values, plus the modules' names and the
    parameters' bound values (neither is in hardware: a board's read-back lacks them)."""
    check(prog)
    names = [m.name for m in prog.modules]
    mods = []
    for k, m in enumerate(prog.modules):
        regs: dict[str, int] = {"CTRL": 1 | (2 if m.auto_rearm else 0), "TARGET": m.target}
        for j in range(R.N_SLOTS):
            regs[f"SRC{j}"] = 0
            regs[f"ACT{j}"] = 0
        for j, s in enumerate(m.counts):
            kind = s.signal.split(".")[0]
            sig = SIGNALS[(kind, s.signal.split(".")[1])]
            filt = 0 if s.src_node is None else s.src_node + 1
            regs[f"SRC{j}"] = sig | (_index_code(kind, s.index, names) << 8) | (filt << 16)
        for j, a in enumerate(m.actions):
            kind = {"tune": "tx", "start": "tx", "stream": "DAC", "arm": "module",
                    "reset": "module", "irq": "none"}[a.name]
            idx = 0 if a.index is None else _index_code(kind, a.index, names)
            regs[f"ACT{j}"] = ACTIONS[a.name] | (idx << 8) | ((a.arg or 0) << 16)
        mods.append({"slot": k, "name": m.name, "registers": regs})
    return {"design": R.DESIGN_NAME, "params": dict(prog.params), "modules": mods}


def image_writes(image: dict) -> list[tuple[int, int]]:
    """(offset, value) register writes that load an image; CTRL (arm) goes last per module."""
    out = []
    for mod in image["modules"]:
        m, regs = mod["slot"], mod["registers"]
        out.append((R.ca(m, "RESET"), 1))
        out.append((R.ca(m, "TARGET"), regs["TARGET"]))
        out += [(R.ca(m, f"SRC{j}"), regs[f"SRC{j}"]) for j in range(R.N_SLOTS)]
        out += [(R.ca(m, f"ACT{j}"), regs[f"ACT{j}"]) for j in range(R.N_SLOTS)]
        out.append((R.ca(m, "CTRL"), regs["CTRL"]))
    return out


def decompile(image: Any) -> Program:
    """An image (JSON, or a board's read-back) back to a program; anything that is not
    one is a CountActionError saying why, never another exception."""
    if not isinstance(image, dict):
        raise CountActionError(f"an image is a JSON object, not {type(image).__name__}")
    try:
        return _decompile(image)
    except CountActionError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise CountActionError(f"malformed image: {type(e).__name__}: {e}") from None


def _decompile(image: dict[str, Any]) -> Program:
    if image.get("design") != R.DESIGN_NAME:
        raise CountActionError(f"image is for design {image.get('design')!r}, not "
                               f"{R.DESIGN_NAME!r}")
    mods = _image_modules(image.get("modules"))
    names = [d.get("name") or f"mod{d['slot']}" for d in mods]
    prog = Program(params=_image_params(image.get("params", {})))
    for d, name in zip(mods, names, strict=True):
        regs = d["registers"]
        m = Module(name, target=regs["TARGET"], auto_rearm=bool(regs["CTRL"] & 2))
        for j in range(R.N_SLOTS):
            w = regs.get(f"SRC{j}", 0)
            if w & 0xFF:
                kind, fld = SIGNAL_NAMES.get(w & 0xFF, ("?", "?"))
                if kind == "?":
                    raise CountActionError(f"{name}: SRC{j} has unknown signal {w & 0xFF}")
                i = (w >> 8) & 0xFF
                if kind == "module" and i >= len(names):
                    raise CountActionError(f"{name}: SRC{j} names module {i}, of {len(names)}")
                idx: int | str = ((R.PORTS[i] if i < len(R.PORTS) else ANY_PORT)
                                  if kind in ("rx", "tx") else
                                  names[i] if kind == "module" else i)
                filt = w >> 16
                m.counts.append(Source(f"{kind}.{fld}", idx, filt - 1 if filt else None))
            w = regs.get(f"ACT{j}", 0)
            if w & 0xFF:
                a = ACTION_NAMES.get(w & 0xFF)
                if a is None:
                    raise CountActionError(f"{name}: ACT{j} has unknown action {w & 0xFF}")
                i = (w >> 8) & 0xFF
                arg = w >> 16
                if (a in ("tune", "start") and i >= len(R.PORTS)) or \
                        (a in ("arm", "reset") and i >= len(names)):
                    raise CountActionError(f"{name}: ACT{j} {a} has no target {i}")
                if a in ("tune", "start"):
                    m.actions.append(Action(a, R.PORTS[i], arg if a == "tune" else None))
                elif a == "stream":
                    m.actions.append(Action(a, i))
                elif a in ("arm", "reset"):
                    m.actions.append(Action(a, names[i]))
                else:
                    m.actions.append(Action("irq"))
        prog.modules.append(m)
    check(prog)
    return prog


def _image_modules(mods: Any) -> list[dict[str, Any]]:
    """The image's modules, checked as the engine and the language would take them: a
    slot each (0..N_MODULES-1, once), a name the parser reads back, 32-bit registers."""
    if not isinstance(mods, list) or not 0 < len(mods) <= R.N_MODULES:
        raise CountActionError(f"image modules: a list of 1 to {R.N_MODULES}")
    seen: set[Any] = set()
    for d in mods:
        if not isinstance(d, dict):
            raise CountActionError("image modules: each an object")
        slot, name, regs = d.get("slot"), d.get("name"), d.get("registers")
        if type(slot) is not int or not 0 <= slot < R.N_MODULES or slot in seen:
            raise CountActionError(f"image module slot {slot!r}: 0..{R.N_MODULES - 1}, once")
        seen.add(slot)
        if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise CountActionError(f"image module {slot}: name {name!r} is not an identifier")
        if not isinstance(regs, dict) or not set(regs) <= _REGISTERS or not all(
                type(v) is int and 0 <= v <= 0xFFFFFFFF for v in regs.values()):
            raise CountActionError(f"image module {slot}: registers are CTRL, TARGET, SRCn "
                                   f"and ACTn, each a 32-bit unsigned integer")
    names = [d.get("name") or f"mod{d['slot']}" for d in mods]
    if len(set(names)) != len(names):
        raise CountActionError(f"image modules: names {names} are not unique")
    return sorted(mods, key=lambda d: d["slot"])


def _image_params(params: Any) -> dict[str, int]:
    if not isinstance(params, dict) or len(params) > MAX_PARAMS:
        raise CountActionError(f"image params: an object of at most {MAX_PARAMS} names")
    for k, v in params.items():
        if not (re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]{0,63}", k) and type(v) is int
                and 0 <= v <= MAX_TARGET):
            raise CountActionError(f"image params: {k!r} = {v!r} is not NAME = 0..{MAX_TARGET}")
    return dict(params)
