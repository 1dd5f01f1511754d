"""`oddl emulate`, `node`, `dashboard`, `broker-config`, `accept`: the testbed and its
services."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import click
from oddl.app.cli.main import (
    Finite,
    _config_fail,
    control_model_options,
    fail,
    key_option,
    main,
    new_file,
)
from oddl.controller.base.config import ConfigError, load_testbed
from oddl.controller.base.extras import require
from oddl.controller.base.faultkinds import cli_help
from oddl.controller.serving.lifecycle import Services


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="where to write the emu testbed config (default: <testbed>-emu.toml)")
@click.option("--fault", "faults", multiple=True,
              help=f"{cli_help()} (repeatable)")
@click.option("--external-node", "external", multiple=True,
              help="serve this board without its node program: `oddl node EMU.toml --node "
                   "ID` runs it, as on a lab's host (repeatable)")
@click.option("--local-boards", is_flag=True,
              help="open no PYNQ.remote port for the boards whose node programs run here: "
                   "the emu config names them `local`, and stage 1 reaches them through "
                   "their node programs, as in a lab with its ports closed (docs/deploy.md)")
@click.option("--spin-us", type=Finite(min=0, max=1e9), default=2000, show_default=True,
              envvar="ODDL_EMU_SPIN_US",
              help="while a job runs, poll instead of sleeping for this long after device "
                   "activity and before a device timer: device timing within microseconds, "
                   "for a core (0: always sleep; or ODDL_EMU_SPIN_US; docs/emu-run.md)")
@click.option("--board-model", type=click.Choice(["python", "rtl"]), default=None,
              help="each O-NIC as the Python board model, or as the gateware simulated "
                   "cycle by cycle, with --control-model board the whole onic_top, its "
                   "control unit inside (default: the testbed's board_model; "
                   "docs/gateware.md)")
@control_model_options
def emulate(testbed: Path, out: Path | None, faults: tuple[str, ...],
            external: tuple[str, ...], local_boards: bool, spin_us: float,
            board_model: str | None, control_model: str | None,
            rtl_simulator: str | None) -> None:
    """Serve the testbed's devices on 127.0.0.1 (PYNQ.remote, serial ptys, MQTT) until Ctrl-C."""
    import asyncio

    from oddl.sim.devices.faults import FaultSpecError, parse_fault
    from oddl.sim.emulate import serve

    try:
        tb = load_testbed(testbed).with_board_model(board_model).with_control_model(
            control_model, rtl_simulator)
    except ConfigError as e:
        _config_fail(e)
        return
    if tb.testbed.board_model == "rtl":
        require("gateware", "the RTL board model (--board-model rtl)")
    if tb.testbed.control_model == "rtl":
        require("gateware", "the RTL control unit (--control-model rtl)")
    if "rtl" in (tb.testbed.board_model, tb.testbed.control_model) and \
            tb.testbed.rtl_simulator == "verilator":
        from oddl.app.cli.main import verilator_ready

        verilator_ready()
    try:
        parsed = [parse_fault(f, tb) for f in faults]
    except FaultSpecError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if any(f.kind == "broker-restart" for f in parsed):
        click.echo("error: --fault broker-restart: a broker that is down from the start "
                   "serves nobody; drill it while a job runs ([[faults]] in the experiment, "
                   "or POST to the control endpoint: docs/faults.md)", err=True)
        sys.exit(2)
    unknown = sorted(set(external) - {n.id for n in tb.expanded().nodes})
    if unknown:
        click.echo(f"error: --external-node: {', '.join(unknown)} is not a node of {tb.name}",
                   err=True)
        sys.exit(2)
    out = out or Path(f"{testbed.stem}-emu.toml")
    if not out.parent.is_dir():
        click.echo(f"error: --out {out}: directory {out.parent} does not exist", err=True)
        sys.exit(2)
    from oddl.sim.devices.realtime import new_loop

    with asyncio.Runner(loop_factory=lambda: new_loop(spin_us * 1e-6,
                                                      collect_when_idle=True)) as runner:
        runner.run(serve(tb, str(testbed), out, lambda line: click.echo(line), parsed,
                         set(external), local_boards))


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--node", "node_id", required=True, help="the node whose O-NIC this runs beside")
@click.option("--irq-pin", default=None,
              help="on the board itself (board = 'local'): the overlay's interrupt pin for "
                   "pynq.Interrupt (default: poll IRQ_STATUS)")
def node(testbed: Path, node_id: str, irq_pin: str | None) -> None:
    """Stage 2 beside one O-NIC: its control units, for every job the controller publishes.

    Runs until Ctrl-C (or SIGTERM, as systemd stops it); docs/deploy.md."""
    import asyncio

    from oddl.app.registry import node_program

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return

    try:
        prog = node_program(tb, node_id, irq_pin=irq_pin)
    except Exception as e:  # the board: say why, exit non-zero
        fail(f"node {node_id}: {e}")

    async def serve() -> None:
        async with Services(f"node {node_id}") as services:
            try:
                await services.start("node program", prog.start(), prog.stop)
            except Exception as e:  # the board or the broker: say which, exit non-zero
                fail(f"node {node_id}: {e}")
            click.echo(f"node {node_id} of {tb.name}: ready")
            try:
                await services.run(prog.wait())
            except Exception as e:  # not asked to stop: it lost the broker (systemd
                fail(f"node {node_id}: stopped serving: {e!r}", 1)  # restarts it)
            finally:
                click.echo(f"node {node_id}: stopped after {prog.jobs_run} jobs")

    asyncio.run(serve())


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True,
              help="0: any free port (the URL is printed)")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="listen address; anything but loopback needs --token-file")
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="a file holding the token every request must carry (?token=...)")
def dashboard(testbed: Path, port: int, host: str, token_file: Path | None) -> None:
    """A live web page of the testbed from its MQTT bus: ports, WSS tables, iterations,
    health, faults, the last acceptance result (docs/dashboard.md)."""
    import asyncio

    from oddl.app.dashboard import Dashboard
    from oddl.app.registry import open_watch
    from oddl.controller.base.access import read_secret

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    if tb.emulator is not None and (gone := tb.emulator.gone()) is not None:
        fail(f"{testbed}: emulator: {gone}", 2)
    token = None
    if token_file is not None:
        try:
            token = read_secret(token_file)
        except OSError as e:
            click.echo(f"error: --token-file {token_file}: {e.strerror or e}", err=True)
            sys.exit(2)
        if len(token) < 16:
            click.echo(f"error: --token-file {token_file}: a token of 16 characters or more",
                       err=True)
            sys.exit(2)
    try:
        dash = Dashboard(tb, open_watch(tb), host, port, token)
    except (ValueError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)

    async def serve() -> None:
        async with Services(f"dashboard of {tb.name}") as services:
            try:
                await dash.serve(services)
            except Exception as e:  # the broker or the port: say which
                fail(f"dashboard: {e}", 1)
            click.echo(f"dashboard of {tb.name}: {dash.url}")
            await services.run(dash.http.wait())

    asyncio.run(serve())


def _as_root(out: Path, files: dict[str, Path]) -> str:
    """Mosquitto started as root drops to the user `mosquitto`, which could not open the
    0600 root-owned passwd ("Unable to open pwfile"): the broker's own files (not the
    parties' secrets) go to that user, and what is still in its way is said."""
    import pwd

    try:
        user = pwd.getpwnam("mosquitto")
    except KeyError:
        return ("as root, Mosquitto drops to the user `mosquitto`, which this host does not "
                "have: run it as the user who owns " + str(out))
    for path in (out, files["mosquitto.conf"], files["passwd"], files["acl"]):
        os.chown(path, user.pw_uid, user.pw_gid)
    blocked = [p for p in out.resolve().parents
               if p.stat().st_uid != user.pw_uid and not p.stat().st_mode & 0o001]
    return (f"as root, Mosquitto drops to the user `mosquitto`: it now owns {out}, its "
            f"conf, passwd and acl (the secrets stay yours)" + (
                f"; it cannot pass {blocked[0]} (mode {blocked[0].stat().st_mode & 0o777:o}):"
                f" chmod o+x it, or write the files elsewhere" if blocked else ""))


@main.command("broker-config")
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="directory for mosquitto.conf, passwd, acl and secrets/ (mode 0700)")
@click.option("--port", type=click.IntRange(1, 65535), default=1883, show_default=True)
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="listen address (a lab's broker listens on its control network)")
def broker_config(testbed: Path, out: Path, port: int, bind: str) -> None:
    """Mosquitto's password and access-rule files for a testbed: each party (controller,
    every node, emulator, dashboard) its own password, speaking only as itself."""
    import ipaddress

    from oddl.controller.base.access import write_mosquitto

    try:
        tb = load_testbed(testbed)
        ipaddress.ip_address(bind)
    except ConfigError as e:
        _config_fail(e)
        return
    except ValueError:
        click.echo(f"error: --bind {bind!r} is not an IP address", err=True)
        sys.exit(2)
    try:
        files = write_mosquitto(tb.name, [n.id for n in tb.nodes], out, port, bind)
    except OSError as e:
        click.echo(f"error: --out {out}: {e.strerror or e}", err=True)
        sys.exit(2)
    parties = [k.removeprefix("secrets/") for k in files if k.startswith("secrets/")]
    click.echo(f"{files['mosquitto.conf']}: mosquitto -c {files['mosquitto.conf']}")
    if os.geteuid() == 0:
        click.echo(_as_root(out, files))
    click.echo(f"{len(parties)} parties ({', '.join(parties[:6])}"
               f"{', ...' if len(parties) > 6 else ''}): each one's password in "
               f"{out / 'secrets'}/<party>; give each party only its own "
               f"([broker] password_file or password_env, docs/mqtt.md)")


@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["emu", "hw"]), default=None,
              help="emu: start `oddl emulate TESTBED` and accept that; hw: the devices the "
                   "config names (default: emu for a sim testbed, else hw)")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="report directory (default: accept-<testbed>-<time>)")
@click.option("--only", "only", multiple=True,
              help="run only this check (repeatable): reachable, identity, registers, "
                   "tuning, routes, loopback, control-rtt, countaction, lightning")
@click.option("--fault", "faults", multiple=True, help="emu: inject a device fault "
              "(see `oddl emulate --help`)")
@click.option("--wait", "wait_s", type=float, default=0.0,
              help="seconds to wait for a testbed another run holds (default: refuse)")
@click.option("--record", type=click.Path(path_type=Path, dir_okay=False), default=None,
              callback=new_file,
              help="write every exchange with the devices to this cassette (.jsonl.gz), "
                   "for `oddl replay` (docs/cassettes.md)")
@key_option("--record-key", "sign the cassette with the key in this file (HMAC-SHA256)")
def accept(testbed: Path, backend: str | None, report: Path | None, only: tuple[str, ...],
           faults: tuple[str, ...], wait_s: float, record: Path | None,
           key: bytes | None) -> None:
    """Pass or fail a testbed, device by device, with the measured figures: exit 0 every
    check passed, 1 one failed, 2 the suite could not run, 3 the testbed is held, 4
    nothing was checked (every check skipped, each saying why)."""
    from oddl.app import accept as acc
    from oddl.app import registry
    from oddl.app.session import EmulatorFailed
    from oddl.controller.service.lock import TestbedBusy

    try:
        tb = load_testbed(testbed)
    except ConfigError as e:
        _config_fail(e)
        return
    backend = backend or registry.default_backend(tb)
    report = report or Path(f"accept-{tb.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        rc = acc.run(testbed, tb, backend, report, list(only), list(faults), wait_s,
                     lambda line: click.echo(line), record, key)
    except (acc.AcceptError, EmulatorFailed, TestbedBusy) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(3 if isinstance(e, TestbedBusy) else 2)
    if registry.serves(tb).devices and (report / "summary.json").exists():
        # for the testbed's dashboard (a private emulator's bus has no watcher)
        import msgspec
        from oddl.app.registry import open_announcer
        from oddl.controller.base.telemetry import accept_note

        note = accept_note(tb.name, json.loads((report / "summary.json").read_text()),
                           time.strftime("%Y-%m-%d %H:%M:%S"))
        try:
            announcer = open_announcer(tb)
            announcer.announce("accept", msgspec.json.encode(note))
            announcer.close()
        except Exception as e:  # the verdict stands; only the dashboard misses it
            click.echo(f"warning: the result was not published on the bus: {e}", err=True)
    sys.exit(rc)


@main.command()
@click.argument("cassette", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="report directory (default: replay-<cassette>-<time>)")
@click.option("--relaxed", is_flag=True,
              help="match each register read by its address, not its place among the "
                   "reads (for a driver change that only reorders them)")
@click.option("--json", "as_json", is_flag=True, help="the replay's summary as JSON")
@key_option("--key", "check the cassette's signature with the key in this file (an "
            "unsigned one, or one signed otherwise, is refused)")
def replay(cassette: Path, report: Path | None, relaxed: bool, as_json: bool,
           key: bytes | None) -> None:
    """Run a recorded `oddl accept` or `oddl run` again with every device served from its
    cassette (no hardware, no emulator): exit 0 if every check, message and figure is as
    recorded; 1 at the first divergence (named: device, exchange, recorded, asked, the
    asking code) or any difference; 2 if the cassette cannot be played."""
    from oddl.app import accept as acc
    from oddl.app.replay import replay as play

    report = report or Path(f"replay-{cassette.name.split('.')[0]}-"
                            f"{time.strftime('%Y%m%d-%H%M%S')}")
    lines: list[str] = []
    say = lines.append if as_json else click.echo
    try:  # --json: stdout is the JSON alone (the suite's own lines go to stderr)
        with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
            rc = play(cassette, report, relaxed, say, key)
    except acc.AcceptError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        summary = json.loads((report / "summary.json").read_text()) \
            if (report / "summary.json").exists() else None
        click.echo(json.dumps({"cassette": str(cassette), "same": rc == 0,
                               "differences": [ln.removeprefix("DIFFERS ") for ln in lines
                                               if ln.startswith("DIFFERS ")],
                               "report": str(report), "summary": summary}, indent=1))
    sys.exit(rc)
