"""Testbed and experiment configs: typed models, TOML loading, domain validation.

Every error names the file, the field path and the reason; validation collects all
errors rather than stopping at the first, so `oddl check` can print them in one go.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from oddl.controller.base.access import RESERVED, check_name
from oddl.controller.base.catalog import (
    IN_NETWORK,
    TRANSFORMERS,
    BackendName,
    CollectiveName,
    ModelName,
    NetworkCollective,
    NetworkKind,
    PolicyName,
    ShapeName,
    SharingName,
    StrategyName,
)
from oddl.controller.base.collectives import optinc_levels
from oddl.controller.base.faultkinds import FAULT_KINDS, KINDS
from oddl.controller.base.parallelism import A100_TFLOPS, Hybrid
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

C_NM = 299_792.458  # speed of light in nm * THz
BAND_NM = (1530.0, 1625.0)  # optical C band (1530-1565) and L band (1565-1625)


@dataclass(frozen=True)
class ConfigIssue:
    file: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.reason}" if self.path else \
            f"{self.file}: {self.reason}"


class ConfigError(Exception):
    """A config file that cannot be used; carries every issue found."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WavelengthGrid(_Model):
    """An ITU-style grid: `count` channels spaced `spacing_ghz` from `start_nm` upwards."""

    start_nm: float
    spacing_ghz: float = Field(gt=0)
    count: int = Field(gt=0, le=512)

    def expand(self) -> list[float]:
        f0 = C_NM / self.start_nm  # THz
        return [round(C_NM / (f0 - i * self.spacing_ghz / 1000.0), 4) for i in range(self.count)]


class Optical(_Model):
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


class ControlNetwork(_Model):
    """The Ethernet control network: carries REQUEST/GRANT/RELEASE, never data."""

    kind: str = "100GbE"
    latency_ns: float = Field(gt=0, description="one-way per-message latency, NIC to NIC")
    request_timeout_ns: float = Field(default=50_000, gt=0)
    max_retries: int = Field(default=20, ge=0)
    grant_lease_ns: float = Field(default=100_000, gt=0)


class Monitor(_Model):
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


class Broker(_Model):
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


MAX_NODES = 65_536  # the job topics' bound (controller/stage2/job.py): 256 x 256
# a ring's flows grow as n^2: 2 M at 1,024 ranks (SiP-ML's ring, jocn-1024-vgg19) runs in
# half a minute; 4,096 ranks' 33 M took check 110 s and 8 GB (issue 33)
MAX_FLOWS_PER_ITERATION = 4_000_000
MAX_FILE_BYTES = 16 << 20  # a grid-4096 testbed written out is ~1 MB


class Emulator(_Model):
    """Where `oddl emulate` takes a drill's faults while a job runs (written into the emu
    config it produces; a lab's testbed has none)."""

    control: str = Field(pattern=r"^http://127\.0\.0\.1:\d{1,5}$",
                         description="the emulator's control endpoint (loopback only)")
    token_file: str = Field(min_length=1, description="file holding its bearer token, "
                                                       "mode 0600")


class Grid(_Model):
    rows: int = Field(gt=0, le=MAX_NODES)
    cols: int = Field(gt=0, le=MAX_NODES)

    @model_validator(mode="after")
    def _size(self) -> Grid:
        if self.rows * self.cols > MAX_NODES:
            raise ValueError(f"{self.rows} x {self.cols} = {self.rows * self.cols} nodes; "
                             f"oddl runs at most {MAX_NODES}")
        return self


class Node(_Model):
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


class WSS(_Model):
    id: str = Field(min_length=1)
    axis: Literal["row", "col"]
    index: int = Field(ge=0)
    ports: int = Field(gt=0, le=4096)
    serial: str | None = None


class Generate(_Model):
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


class Meta(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    backend: BackendName = "sim"
    # how sim and `oddl emulate` model each O-NIC: the Python board model, or the gateware
    # (fpga/gateware) simulated cycle by cycle behind the same pynq device (docs/gateware.md)
    board_model: Literal["python", "rtl"] = "python"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name("testbed name", v)


class QickPhotonics(_Model):
    """The emulated photonic path behind a QICK board (sim/devices/qick_soc.py)."""

    extinction_ratio_db: float = Field(default=20.0, gt=0, description="modulators")
    full_scale: float = Field(default=0.8, gt=0, le=1.0,
                              description="detector output at full transmission, of ADC range")
    noise_rms_lsb: float = Field(default=2.0, ge=0, description="additive, per ADC sample")
    adc_bits: int | None = Field(default=14, ge=4, le=24, description="None: no quantization")
    dark_offset_lsb: float = Field(default=30.0, description="detector dark level + offset")


class Qick(_Model):
    """A QICK RFSoC board running Lightning's photonic multiply."""

    soc: str = Field(default="emulated", description="'emulated' (in process), 'local' "
                     "(QickSoc on this board) or pyro://NAMESERVER:PORT/PROXY_NAME")
    dac_channels: tuple[int, int] = (0, 1)
    adc_channel: int = Field(default=0, ge=0)
    photonics: QickPhotonics = QickPhotonics()

    @field_validator("soc")
    @classmethod
    def _soc(cls, v: str) -> str:
        if v not in ("emulated", "local") and not re.match(r"^pyro://[^:/]+:\d+/\S+$", v):
            raise ValueError("'emulated', 'local' or pyro://HOST:PORT/NAME")
        return v


class Acceptance(_Model):
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
    timeout_s: float = Field(default=2.0, gt=0, description="device wait per operation")


class Testbed(_Model):
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


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    s = ""
    for part in loc:
        if isinstance(part, int):
            s += f"[{part}]"
        else:
            s += ("." if s else "") + str(part)
    return s


def _read_text(path: Path) -> str:
    """A config file's text, or a ConfigError naming the file and why (missing, not a
    regular file, too big, not UTF-8)."""
    def fail(why: str) -> ConfigError:
        return ConfigError([ConfigIssue(str(path), "", why)])

    try:
        if not path.is_file():  # a directory, /dev/zero, a FIFO: never read it
            raise fail("file not found" if not path.exists() else "not a regular file")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise fail(f"{path.stat().st_size} bytes: a config is at most {MAX_FILE_BYTES}")
        with path.open("rb") as f:
            return f.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    except UnicodeDecodeError as e:
        raise fail(f"not UTF-8 text (byte {e.start}): {e.reason}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's data, or a ConfigError naming the file and why (`_read_text`'s
    reasons, not TOML, a number too long to convert)."""
    def fail(why: str) -> ConfigError:
        return ConfigError([ConfigIssue(str(path), "", why)])

    text = _read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise fail(f"not valid TOML: {e}") from None
    except ValueError as e:  # e.g. an integer literal over Python's 4300-digit limit
        raise fail(f"not a usable TOML value: {e}") from None


def _is_experiment(data: dict[str, Any]) -> bool:
    return "workload" in data or "jobs" in data or "jobs_trace" in data


def kind_of(path: Path) -> str:
    """'experiment', 'sweep' or 'testbed', from a config's top-level tables (best effort:
    an unreadable file is left for the loader to explain)."""
    try:
        data = _read_toml(path)
    except ConfigError:
        return "testbed"
    if _is_experiment(data):
        return "job" if "testbed" not in data and "networks" not in data and \
            "workload" in data else "experiment"
    if "models" in data or "line_rates_gbps" in data:
        return "sweep"
    return "testbed"


def field_issues(e: ValidationError) -> list[tuple[str, str]]:
    """(field path, reason) of each of a validation's errors, in our words: no "Value
    error, " prefix, no link to pydantic's pages."""
    return [(_fmt_loc(err["loc"]), re.sub(r"^(Value error|Assertion failed), ", "",
                                          err["msg"])) for err in e.errors()]


def job_experiment(data: dict[str, Any], testbed: str, path: str = "job") -> Experiment:
    """A job for an arbiter (an experiment of one `[workload]` without `testbed` and
    `networks`: they are the arbiter's) as the experiment it runs; ConfigError names the
    field and why."""
    try:
        exp = Experiment.model_validate({"networks": [{"name": "oddl", "kind": "oddl"}],
                                         **data, "testbed": testbed})
    except ValidationError as e:
        raise ConfigError([ConfigIssue(path, f, why) for f, why in field_issues(e)]) from None
    if exp.workload is None:
        raise ConfigError([ConfigIssue(path, "workload", "a job is one [workload] (for "
                                       "[[jobs]], `oddl run` an experiment)")])
    return exp


def load_job(path: str | Path) -> Experiment:
    """A job file (`oddl submit`'s), checked as far as it can be without the arbiter's
    testbed."""
    path = Path(path)
    return job_experiment(_read_toml(path), "-", str(path))


def _pydantic_issues(path: Path, e: ValidationError) -> list[ConfigIssue]:
    return [ConfigIssue(str(path), f, why) for f, why in field_issues(e)]


def load_testbed(path: str | Path) -> Testbed:
    """Load, expand and validate a testbed file; raise ConfigError listing every problem."""
    path = Path(path)
    data = _read_toml(path)
    if _is_experiment(data) or "models" in data:
        raise ConfigError([ConfigIssue(str(path), "", "this is an experiment or a sweep, not a "
                                       "testbed")])
    try:
        tb = Testbed.model_validate(data).expanded()
    except ValidationError as e:
        raise ConfigError(_pydantic_issues(path, e)) from None
    issues = [ConfigIssue(str(path), p, r) for p, r in domain_issues(tb)]
    if issues:
        raise ConfigError(issues)
    return tb


# --- experiments ---------------------------------------------------------------------------

class Calibration(_Model):
    """Fit the per-iteration compute time so that `network` trains in `training_time_min`."""

    network: str
    training_time_min: float = Field(gt=0, le=1e9, allow_inf_nan=False)


class Parallelism(_Model):
    """A Transformer's split over its ranks (controller/base/parallelism.py): tensor x
    pipeline x data = ranks; each replica trains micro_batches x micro_batch_size
    sequences an iteration, its compute from the model's FLOPs at gpu_tflops."""

    data: int = Field(ge=1, le=65536)
    tensor: int = Field(default=1, ge=1, le=65536)
    pipeline: int = Field(default=1, ge=1, le=65536)
    micro_batches: int | None = Field(
        default=None, ge=1, le=4096,
        description="default 4 x pipeline (GPipe: the bubble is small from there)")
    micro_batch_size: int = Field(default=1, ge=1, le=4096, description="sequences")
    gpu_tflops: float = Field(default=A100_TFLOPS, gt=0, le=1e6, allow_inf_nan=False,
                              description="sustained FLOP rate (default: A100 BF16 peak)")

    @property
    def ranks(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def batches(self) -> int:
        """Micro-batches an iteration: as given, or 4 x pipeline."""
        return self.micro_batches or 4 * self.pipeline

    @property
    def samples_per_iteration(self) -> int:
        return self.data * self.batches * self.micro_batch_size

    def hybrid(self, model: str, bytes_per_param: int) -> Hybrid:
        return Hybrid(model, self.tensor, self.pipeline, self.data, self.batches,
                      self.micro_batch_size, self.gpu_tflops, bytes_per_param)


def _hybrid_compute(parallelism: Parallelism | None, model: str, batch_per_node: int | None,
                    compute_time_ms: float | None, calibrated: bool) -> None:
    """What a workload says of its batch and compute, with a split or without one."""
    if parallelism is None:
        if batch_per_node is None:
            raise ValueError("batch_per_node: give it")
        return
    if model not in TRANSFORMERS:
        raise ValueError(f"parallelism: {model} is not a Transformer; hybrid parallelism "
                         f"takes one of {', '.join(TRANSFORMERS)}")
    if batch_per_node is not None or compute_time_ms is not None or calibrated:
        raise ValueError("parallelism: a replica's batch is micro_batches x micro_batch_size "
                         "and its compute comes from the model's FLOPs: give no "
                         "batch_per_node, compute_time_ms or calibrate")


class Workload(_Model):
    model: ModelName
    collective: CollectiveName
    epochs: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    dataset_samples: int = Field(gt=0)
    batch_per_node: int | None = Field(default=None, gt=0,
                                       description="required without parallelism")
    bytes_per_param: int = Field(default=4, gt=0)
    ranks: int | None = Field(default=None, ge=1, le=65536,
                              description="the job's ranks, on the testbed's first nodes in "
                                          "grid order (default: every node); the rest are "
                                          "spares and relays")
    compute_time_ms: float | None = Field(default=None, ge=0)
    calibrate: Calibration | None = None
    parallelism: Parallelism | None = Field(
        default=None, description="a Transformer's tensor, pipeline and data split")

    @model_validator(mode="after")
    def _compute(self) -> Workload:
        _hybrid_compute(self.parallelism, self.model, self.batch_per_node,
                        self.compute_time_ms, self.calibrate is not None)
        if self.parallelism is None and (self.compute_time_ms is None) == \
                (self.calibrate is None):
            raise ValueError("give exactly one of compute_time_ms or calibrate")
        return self

    def samples_per_iteration(self, n_nodes: int) -> int:
        p = self.parallelism
        if p is not None:
            return p.samples_per_iteration
        assert self.batch_per_node is not None
        return self.batch_per_node * (self.ranks or n_nodes)


JOB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_JOBS = 10_000  # [[jobs]] entries plus trace rows


class JobEntry(_Model):
    """One job of a multi-job experiment (docs/multijob.md): what it trains, on how many
    nodes, for how long, and when it arrives."""

    name: str = Field(pattern=JOB_NAME, description="unique in the experiment")
    model: ModelName
    collective: CollectiveName = "hd"
    ranks: int = Field(ge=1, le=65536, description="nodes the job needs")
    iterations: int | None = Field(default=None, gt=0, le=10_000_000)
    epochs: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    dataset_samples: int | None = Field(default=None, gt=0, description="with epochs")
    batch_per_node: int = Field(default=32, gt=0, le=1 << 20)
    bytes_per_param: int = Field(default=4, gt=0, le=16)
    compute_time_ms: float | None = Field(
        default=None, ge=0, le=1e9, allow_inf_nan=False,
        description="default: the Table 1 calibration scaled by the model's MACs")
    arrival_ms: float = Field(default=0.0, ge=0, le=1e12, allow_inf_nan=False)
    shape: ShapeName = Field(default="any", description="placement hint: a row segment, a "
                             "column segment, a sub-grid, or the first that fits")
    weight: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False,
                          description="its share of a link, where the network's sharing is "
                                      "'weighted' (0.6 and 0.4: 60/40)")
    shift_ms: float = Field(default=0.0, ge=0, le=1e7, allow_inf_nan=False,
                            description="a time shift: its first iteration starts this long "
                                        "after the job starts (CASSINI; `oddl compat`)")
    parallelism: Parallelism | None = Field(
        default=None, description="a Transformer's tensor, pipeline and data split")

    @model_validator(mode="after")
    def _length(self) -> JobEntry:
        if (self.iterations is None) == (self.epochs is None):
            raise ValueError("give exactly one of iterations or epochs")
        if self.epochs is not None and self.dataset_samples is None:
            raise ValueError("epochs needs dataset_samples")
        _hybrid_compute(self.parallelism, self.model,
                        self.batch_per_node if "batch_per_node" in self.model_fields_set
                        else 32 if self.parallelism is None else None,
                        self.compute_time_ms, False)
        return self

    def total_iterations(self) -> int:
        if self.iterations is not None:
            return self.iterations
        assert self.epochs is not None and self.dataset_samples is not None
        p = self.parallelism
        per = p.samples_per_iteration if p is not None else self.batch_per_node * self.ranks
        return math.ceil(self.epochs * math.ceil(self.dataset_samples / per))


TRACE_COLUMNS = ("arrival_ms", "model", "ranks", "iterations")  # required; any other
# JobEntry field may be a column too (name, collective, compute_time_ms, shape, ...)


def load_trace(path: Path) -> list[JobEntry]:
    """A CSV job trace: one job per row, named `<file stem>-<row>` unless it has a name;
    a row that does not parse is a ConfigError naming the file, the row, the job and the
    field."""
    text = _read_text(path)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    head = reader.fieldnames or []
    missing = [c for c in TRACE_COLUMNS if c not in head]
    unknown = [c for c in head if c not in JobEntry.model_fields]
    if missing or unknown:
        why = (f"missing column(s) {', '.join(missing)}" if missing else
               f"unknown column(s) {', '.join(map(repr, unknown))}")
        raise ConfigError([ConfigIssue(str(path), "header", f"{why}; a trace has "
                                       f"{', '.join(TRACE_COLUMNS)} (docs/multijob.md)")])
    jobs: list[JobEntry] = []
    issues: list[ConfigIssue] = []
    for k, row in enumerate(reader, start=1):
        if k > MAX_JOBS:
            issues.append(ConfigIssue(str(path), f"row {k}", f"a trace has at most {MAX_JOBS} "
                                      "jobs"))
            break
        if None in row or any(v is None for v in row.values()):
            issues.append(ConfigIssue(str(path), f"row {k}", f"{len(head)} columns expected"))
            continue
        data = {c: v.strip() for c, v in row.items() if v.strip() != ""}
        data.setdefault("name", f"{path.stem}-{k}")
        try:
            jobs.append(JobEntry.model_validate(data))
        except ValidationError as e:
            issues += [ConfigIssue(str(path), f"row {k} (job {data['name']!r})"
                                   + ("." + _fmt_loc(err["loc"]) if err["loc"] else ""),
                                   err["msg"]) for err in e.errors()]
    if issues:
        raise ConfigError(issues)
    return jobs


class NetworkSpec(_Model):
    """One network of an experiment; the parameters of the baselines are documented in
    docs/baselines.md."""

    name: str = Field(min_length=1)
    kind: NetworkKind
    collective: NetworkCollective | None = Field(
        default=None, description="the collective this network runs (default: the workload's; "
                                  "optinc: its own)")
    strategy: StrategyName = "matched"
    relay: Literal["row-first", "col-first"] = Field(
        default="row-first", description="oddl: which dimension a two-hop flow takes first")
    latency_ns: float = Field(default=1000.0, ge=0,
                              description="electrical/sipring: per flow; fattree: per switch; "
                                          "topoopt: per hop; optinc: optical path per level")
    hosts_per_leaf: int = Field(default=16, ge=1, description="fattree")
    spines: int = Field(default=8, ge=1, description="fattree")
    oversubscription: float = Field(default=1.0, gt=0, description="fattree")
    wavelengths: int = Field(default=64, ge=1, description="sipring: channels per fibre")
    degree: int = Field(default=4, ge=1, description="sipring, sipocs: transceivers per "
                                                     "node; topoopt: ports per node; oddl: "
                                                     "the optical degree `oddl plan` checks")
    bidirectional: bool = Field(
        default=False, description="topoopt and totientrings: TotientPerms' bidirectional "
                                   "mode, degree / 2 jumps each with its reverse")
    reconfig_ns: float = Field(default=25_000.0, ge=0,
                               description="sipring, sipocs: MRR retuning")
    link_gbps: float | None = Field(default=None, gt=0,
                                    description="topoopt: per port (default: the line "
                                                "rate); sipring, sipocs: per transceiver "
                                                "(default: the line rate / degree)")
    transceivers: int = Field(default=4, ge=1, le=64,
                              description="optinc: transceivers per server (M)")
    ports: int = Field(default=32, ge=2, le=4096,
                       description="optinc: servers one unit averages; more need two levels")
    sharing: SharingName = Field(
        default="fair", description="how jobs share a link (docs/cassini.md): max-min fair, "
                                    "by the jobs' weights, or MLTCP")
    mltcp_slope: float = Field(default=1.0, ge=0, le=100, allow_inf_nan=False,
                               description="mltcp: F = slope x bytes_ratio + intercept")
    # at least 0.001: the weights (intercept to slope + intercept) then differ by at most
    # 1e5, so a flow's rate stays a number (1e-300 made one job's rate 1e-300 of a link's,
    # and its finish time overflowed)
    mltcp_intercept: float = Field(default=1.0, ge=0.001, le=100, allow_inf_nan=False)
    mltcp_tick_us: float = Field(default=100.0, ge=1, le=1e6, allow_inf_nan=False,
                                 description="mltcp: how often the weights follow the ratio")
    cc_tick_us: float = Field(default=2.0, ge=0.1, le=1000, allow_inf_nan=False,
                              description="dcqcn, tcp: the congestion-control model's step")
    cassini: bool = Field(
        default=False, description="several jobs: each job's start is delayed as CASSINI's "
                                   "geometry says against the jobs running beside it (its "
                                   "demand measured alone; replaces the jobs' shift_ms; "
                                   "docs/cassini.md)")

    @model_validator(mode="after")
    def _consistent(self) -> NetworkSpec:
        if self.bidirectional and self.degree < 2:
            raise ValueError("bidirectional TotientPerms spends two ports per jump: give "
                             "degree >= 2")
        if self.kind == "oddl" and (self.sharing != "fair" or self.cassini):
            raise ValueError(f"{'sharing' if self.sharing != 'fair' else 'cassini'}: ODDL "
                             "gives each job its own wavelengths; no link is shared (a "
                             "baseline network's option)")
        if (self.kind == "optinc") != (self.collective == IN_NETWORK):
            raise ValueError(f"collective {IN_NETWORK!r} is OptINC's in-network averaging: it "
                             "runs on kind 'optinc' only, and kind 'optinc' runs nothing else")
        return self

    @model_validator(mode="before")
    @classmethod
    def _optinc_averages(cls, data: Any) -> Any:
        """OptINC's all-reduce is its own: the workload's collective does not apply."""
        if isinstance(data, dict) and data.get("kind") == "optinc" and \
                data.get("collective") is None:
            return {**data, "collective": IN_NETWORK}
        return data


# a Literal of the catalogue's kinds, which pydantic checks; to the type checker a str
if TYPE_CHECKING:
    FaultKind: TypeAlias = str
else:
    FaultKind = Literal[FAULT_KINDS]


class FaultSpec(_Model):
    """One fault of a drill: what breaks, where, when, and for how long (absent: for good).

    Extra fields by kind: slow-tx `tune_ns`; wss-route `input`, `channel`, `output` (light
    on that input and channel leaves at that output, though the table reads back right);
    control-loss `drop_probability` (and `delay_probability`, `max_extra_delay_ns`);
    dac-not-ready `dac`."""

    kind: FaultKind
    target: str = Field(min_length=1, max_length=200)
    at_iteration: int | None = Field(default=None, ge=0, le=10_000_000)
    at_ms: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    duration_ms: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    tune_ns: int | None = Field(default=None, gt=0, le=10**12)
    input: int | None = Field(default=None, ge=0, le=4096)
    channel: int | None = Field(default=None, ge=0, le=512)
    output: int | None = Field(default=None, ge=0, le=4096)
    drop_probability: float = Field(default=0.0, ge=0, le=1)
    delay_probability: float = Field(default=0.0, ge=0, le=1)
    max_extra_delay_ns: float = Field(default=0.0, ge=0, le=1e12, allow_inf_nan=False)
    dac: int | None = Field(default=None, ge=0, le=64)

    @model_validator(mode="after")
    def _fields(self) -> FaultSpec:
        if self.at_iteration is not None and self.at_ms is not None:
            raise ValueError("give at most one of at_iteration and at_ms (neither: from the "
                             "start)")
        missing = [f for f in KINDS[self.kind].needs if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{self.kind} needs {', '.join(missing)}")
        if self.kind == "control-loss" and not (self.drop_probability
                                                or self.delay_probability):
            raise ValueError("control-loss needs drop_probability or delay_probability")
        return self

    @property
    def start_ms(self) -> float:
        return self.at_ms or 0.0

    def __str__(self) -> str:
        when = (f"at iteration {self.at_iteration}" if self.at_iteration is not None
                else f"at {self.start_ms:g} ms")
        span = f" for {self.duration_ms:g} ms" if self.duration_ms is not None else ""
        return f"{self.kind} {self.target} {when}{span}"


def fault_issues(faults: list[FaultSpec], tb: Testbed) -> list[tuple[str, str]]:
    """Every fault's target against the testbed: (field path, reason) pairs."""
    out: list[tuple[str, str]] = []
    nodes = {n.id: n for n in tb.nodes}
    wss = {w.id: w for w in tb.wss}
    groups = {(w.axis, w.index) for w in tb.wss}
    n_ch = len(tb.optical.wavelengths())
    for i, f in enumerate(faults):
        at = f"faults[{i}]"
        want = KINDS[f.kind].target
        node, _, port = f.target.partition("/")
        if want == "NODE":
            if f.target not in nodes:
                out.append((f"{at}.target", f"no node {f.target!r} in {tb.name}"))
        elif want == "NODE/PORT":
            if node not in nodes:
                out.append((f"{at}.target", f"no node {node!r} in {tb.name} (expected "
                                            f"NODE/PORT, e.g. {tb.nodes[0].id}/H)"))
            elif port not in ("H", "V"):
                out.append((f"{at}.target", f"no port {port!r} on {node}: H or V"))
            elif (("row", nodes[node].row) if port == "H" else ("col", nodes[node].col)
                  ) not in groups:
                out.append((f"{at}.target", f"{node} has no {port} port here (no WSS on it)"))
        elif want == "WSS":
            w = wss.get(f.target)
            if w is None:
                out.append((f"{at}.target", f"no WSS {f.target!r} in {tb.name}"))
            elif f.kind == "wss-route":
                for fld, v, lim in (("input", f.input, w.ports), ("output", f.output, w.ports),
                                    ("channel", f.channel, n_ch)):
                    if v is not None and v >= lim:
                        out.append((f"{at}.{fld}", f"{v} is outside {w.id} (0..{lim - 1})"))
        elif want in ("bus", "broker"):
            if f.target != want:
                out.append((f"{at}.target", f"a {f.kind} fault's target is {want!r}"))
        else:
            if tb.qick is None:
                out.append((f"{at}.kind", f"{tb.name} has no [qick] board"))
            elif f.dac not in tb.qick.dac_channels:
                out.append((f"{at}.dac", f"DAC {f.dac} is not one of the board's operand "
                                         f"DACs {list(tb.qick.dac_channels)}"))
    return out


OLD_FAULTS = ("the [faults] table is gone: a fault is now an entry of the [[faults]] list. "
              "Rewrite it as\n  [[faults]]\n  kind = \"control-loss\"\n  target = \"bus\"\n"
              "  drop_probability = ...\n  delay_probability = ...\n  max_extra_delay_ns = ...\n"
              "(docs/faults.md lists every kind)")


class Experiment(_Model):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="names the run directory: letters, digits, '_', '.', '-'")
    description: str = ""
    testbed: str = Field(min_length=1, description="relative to this file's directory")
    seed: int = 0
    iterations: int | None = Field(default=None, gt=0, description="override epochs")
    workload: Workload | None = Field(default=None, description="one job (or [[jobs]])")
    jobs: list[JobEntry] = Field(default_factory=list, max_length=MAX_JOBS)
    jobs_trace: str | None = Field(default=None, min_length=1, description="a CSV of jobs, "
                                   "relative to this file's directory")
    policy: PolicyName = Field(default="fifo", description="the order queued jobs start in")
    networks: list[NetworkSpec] = Field(min_length=1)
    faults: list[FaultSpec] = Field(default_factory=list, max_length=1024)
    recovery: Literal["relay", "spare", "shrink"] = Field(
        default="relay", description="what a dead rank costs: relay (routes go round dead "
        "relays and WSSs; a dead rank stops the run), spare (the rank moves to a free node), "
        "shrink (the job goes on with fewer ranks)")
    flow_records: Literal["all", "none"] = "all"
    disturbance_threshold: float = Field(
        default=0.001, ge=0, le=1e6, description="a network's run is flagged disturbed when "
        "its disturbance events (junk refused, messages lost, retries, lapsed grants, "
        "unexpected transfers) exceed this share of its control messages, or a board's "
        "registers were changed by another writer")
    reference: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reference")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        """The paper's figures are printed beside ours: a number, finite (nan passed)."""
        for k, x in v.items():
            if isinstance(x, float) and not math.isfinite(x):
                raise ValueError(f"{k} = {x}: a paper's figure is a finite number")
        return v

    @model_validator(mode="after")
    def _names(self) -> Experiment:
        names = [n.name for n in self.networks]
        if len(set(names)) != len(names):
            raise ValueError(f"network names must be unique, got {names}")
        several = bool(self.jobs) or self.jobs_trace is not None
        if several == (self.workload is not None):
            raise ValueError("give either a [workload] or jobs ([[jobs]] and/or jobs_trace)")
        if several and any(f.at_iteration is not None for f in self.faults):
            raise ValueError("faults: several jobs have no one iteration count; time a "
                             "fault with at_ms")
        cal = self.workload.calibrate if self.workload is not None else None
        if cal is not None and cal.network not in names:
            raise ValueError(f"workload.calibrate.network {cal.network!r} is not one of {names}")
        return self


@dataclass(frozen=True)
class LoadedExperiment:
    path: Path
    experiment: Experiment
    testbed_path: Path
    testbed: Testbed
    jobs: tuple[JobEntry, ...] = ()  # [[jobs]] then the trace's rows

    @property
    def workload(self) -> Workload:
        """The single job's workload (a multi-job experiment has none)."""
        w = self.experiment.workload
        if w is None:
            raise ValueError(f"{self.experiment.name} has several jobs, not one workload")
        return w


def load_experiment(path: str | Path, testbed: str | Path | None = None) -> LoadedExperiment:
    """An experiment and its testbed: `testbed =` is resolved against the experiment
    file's directory (never the current one), unless `testbed` overrides it."""
    path = Path(path)
    data = _read_toml(path)
    if "models" in data and not _is_experiment(data):
        raise ConfigError([ConfigIssue(str(path), "", "this is a sweep: run it with `oddl "
                                       "sweep`")])
    if not _is_experiment(data) and {"grid", "nodes", "optical"} & set(data):
        raise ConfigError([ConfigIssue(str(path), "", "this is a testbed, not an experiment "
                                       "(`oddl check` checks either; experiments/ has "
                                       "experiments to run on it)")])
    if isinstance(data.get("faults"), dict):
        raise ConfigError([ConfigIssue(str(path), "faults", OLD_FAULTS)])
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_job_named(_pydantic_issues(path, e), data)) from None
    tb_path = Path(testbed) if testbed else (path.parent / exp.testbed)
    try:
        tb = load_testbed(tb_path)
    except ConfigError as e:
        if testbed or not e.issues or e.issues[0].path:
            raise
        raise ConfigError([ConfigIssue(str(path), "testbed",
                                       f"{tb_path.resolve()}: {e.issues[0].reason}")]
                          ) from None
    issues = [ConfigIssue(str(path), p, r) for p, r in fault_issues(exp.faults, tb)]
    w = exp.workload
    jobs = list(exp.jobs) + (load_trace(path.parent / exp.jobs_trace) if exp.jobs_trace
                             else [])
    for i, s in enumerate(exp.networks):
        if s.kind == "optinc":
            for n in [w.ranks or tb.n_nodes] if w is not None else {j.ranks for j in jobs}:
                try:
                    optinc_levels(n, s.ports)
                except ValueError as e:
                    issues.append(ConfigIssue(str(path), f"networks[{i}].ports", str(e)))
    for i, s in enumerate(exp.networks):  # what a run would hold, refused up front
        for what, coll, n in ([("workload.collective", s.collective or w.collective,
                                w.ranks or tb.n_nodes)] if w is not None else
                              [(f"{_where(exp, k)}.collective", s.collective or j.collective,
                                j.ranks) for k, j in enumerate(jobs)]):
            flows = 2 * (n - 1) * n * (s.degree if coll == "totientrings" else 1) \
                if coll in ("ring", "totientrings") else 0
            if flows > MAX_FLOWS_PER_ITERATION and not any(
                    x.path == what and coll in x.reason for x in issues):
                issues.append(ConfigIssue(
                    str(path), what if s.collective is None else f"networks[{i}].collective",
                    f"{coll} on {n} ranks is {flows:,} flows an iteration, more than "
                    f"{MAX_FLOWS_PER_ITERATION:,} (every one is simulated, and its schedule "
                    f"held): halving-doubling or hier2d at this size"))
    if w is not None and (w.ranks or 0) > tb.n_nodes:
        issues.append(ConfigIssue(str(path), "workload.ranks", f"{w.ranks} ranks "
                                  f"but {tb.name} has {tb.n_nodes} nodes"))
    if w is not None and w.parallelism is not None:
        issues += [ConfigIssue(str(path), f"workload.{p}", r) for p, r in parallelism_issues(
            w.parallelism, w.model, w.collective, w.ranks or tb.n_nodes, tb)]
        if exp.recovery == "shrink":
            issues.append(ConfigIssue(str(path), "recovery", "a hybrid-parallel job cannot "
                                      "shrink (tensor x pipeline x data is its rank count): "
                                      "'spare' or 'relay'"))
    issues += _job_issues(path, exp, jobs, tb)
    if issues:
        raise ConfigError(issues)
    return LoadedExperiment(path, exp, tb_path, tb, tuple(jobs))


def _where(exp: Experiment, k: int) -> str:
    """Where job k (of [[jobs]] then the trace) was written."""
    n = len(exp.jobs)
    return f"jobs[{k}]" if k < n else f"{exp.jobs_trace} row {k - n + 1}"


def _job_issues(path: Path, exp: Experiment, jobs: list[JobEntry],
                tb: Testbed) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    if exp.workload is None and not jobs:
        out.append(ConfigIssue(str(path), "jobs_trace" if exp.jobs_trace else "jobs",
                               "no jobs: a multi-job experiment needs at least one"))
    first: dict[str, int] = {}
    for k, j in enumerate(jobs):
        at = f"{_where(exp, k)} (job {j.name!r})"
        if j.name in first:
            out.append(ConfigIssue(str(path), f"{at}.name", f"duplicate job name: "
                                   f"{_where(exp, first[j.name])} has it too"))
        first.setdefault(j.name, k)
        if j.ranks > tb.n_nodes:
            out.append(ConfigIssue(str(path), f"{at}.ranks", f"{j.ranks} ranks but {tb.name} "
                                   f"has {tb.n_nodes} nodes: the job can never start"))
        if j.parallelism is not None:
            out += [ConfigIssue(str(path), f"{at}.{p}", r) for p, r in parallelism_issues(
                j.parallelism, j.model, j.collective, j.ranks, tb, whole_grid=False)]
    return out


def parallelism_issues(par: Parallelism, model: str, collective: str, ranks: int,
                       tb: Testbed, whole_grid: bool = True) -> list[tuple[str, str]]:
    """(field, why) for a hybrid split its model, its ranks or the grid cannot take;
    `whole_grid`: its ranks fill the testbed's rows (one workload), else a rectangle of
    its own, whose width the placement fits to the tensor groups ([[jobs]])."""
    out = [(f"parallelism.{f}", why) for f, why in par.hybrid(model, 4).problems()]
    if par.ranks != ranks:
        out.append(("parallelism", f"tensor {par.tensor} x pipeline {par.pipeline} x data "
                                   f"{par.data} = {par.ranks} ranks, but the job has {ranks}"))
    cols = tb.grid.cols
    if whole_grid and par.tensor > 1 and cols % par.tensor:
        out.append(("parallelism.tensor", f"a tensor group of {par.tensor} ranks would "
                    f"straddle two rows of {tb.name}'s {cols}-column grid (ranks fill it row "
                    f"by row, a group keeps to one WSS row): tensor must divide {cols}"))
    steps = par.hybrid(model, 4).steps_per_rank() * ranks
    if steps > MAX_FLOWS_PER_ITERATION:
        out.append(("parallelism", f"up to {steps:,} steps an iteration over the ranks, more "
                                   f"than {MAX_FLOWS_PER_ITERATION:,} (every one is "
                                   f"simulated): fewer micro_batches or a smaller model"))
    if collective == "hier2d" and par.data > 1:
        out.append(("collective", "hier2d needs the job's whole grid; a data-parallel group "
                                  "of a hybrid job all-reduces with ring, hd or "
                                  "totientrings"))
    return out


def _job_named(issues: list[ConfigIssue], data: dict[str, Any]) -> list[ConfigIssue]:
    """Name the job an issue under jobs[k] is about (its index alone is hard to find)."""
    jobs = data.get("jobs")
    out = []
    for i in issues:
        m = re.match(r"jobs\[(\d+)\]", i.path)
        if m and isinstance(jobs, list) and int(m[1]) < len(jobs) \
                and isinstance(jobs[int(m[1])], dict):
            name = jobs[int(m[1])].get("name")
            i = ConfigIssue(i.file, f"{m[0]} (job {name!r}){i.path[m.end():]}", i.reason)
        out.append(i)
    return out


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
