"""An experiment: its workload (or jobs, or a trace of them), networks, faults and recovery;
loaded with its testbed and checked against it; a job file for an arbiter; what kind a
config file is."""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from oddl.controller.base.accelerators import DEVICES
from oddl.controller.base.catalog import (
    IN_NETWORK,
    TRANSFORMERS,
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
from oddl.controller.base.config.faults import (
    OLD_FAULTS,
    FaultSpec,
    fault_issues,
)
from oddl.controller.base.config.fields import (
    MAX_FLOWS_PER_ITERATION,
    ConfigError,
    ConfigIssue,
    ConfigModel,
    field_issues,
    fmt_loc,
    is_experiment,
    pydantic_issues,
    read_text,
    read_toml,
)
from oddl.controller.base.config.recorded import Recorded, read_recorded
from oddl.controller.base.config.testbed import (
    Testbed,
    load_testbed,
)
from oddl.controller.base.ddp import BUCKET_MB, FIRST_BUCKET_MB, Overlap, ddp_overlap, layer_ns
from oddl.controller.base.layers import layer_models, layer_table
from oddl.controller.base.parallelism import A100_TFLOPS, Hybrid
from pydantic import Field, ValidationError, field_validator, model_validator

if TYPE_CHECKING:
    DeviceName: TypeAlias = str
else:
    DeviceName = Literal[DEVICES]


def kind_of(path: Path) -> str:
    """'experiment', 'sweep' or 'testbed', from a config's top-level tables (best effort:
    an unreadable file is left for the loader to explain)."""
    try:
        data = read_toml(path)
    except ConfigError:
        return "testbed"
    if is_experiment(data):
        return "job" if "testbed" not in data and "networks" not in data and \
            "workload" in data else "experiment"
    if "models" in data or "line_rates_gbps" in data:
        return "sweep"
    return "testbed"


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
    return job_experiment(read_toml(path), "-", str(path))


# --- experiments ---------------------------------------------------------------------------

DISTURBANCE_THRESHOLD = 0.001  # disturbance events a control message: a run is disturbed

class Calibration(ConfigModel):
    """Fit the per-iteration compute time so that `network` trains in `training_time_min`."""

    network: str
    training_time_min: float = Field(gt=0, le=1e9, allow_inf_nan=False)


class Parallelism(ConfigModel):
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


class Training(ConfigModel):
    """How a data-parallel job's iteration runs, from its model's layer table
    (controller/base/ddp.py): its compute from the table's FLOPs on `device`, and with
    `overlap` its gradient buckets all-reduced while backward runs, as DDP does."""

    device: DeviceName | None = Field(
        default=None, description="compute from the model's layer table at this "
                                  "accelerator's sustained rate (docs/model.md)")
    overlap: bool = Field(default=False, description="all-reduce DDP's gradient buckets "
                          "while backward runs (false: compute, then the all-reduce)")
    bucket_mb: float = Field(default=BUCKET_MB, gt=0, le=1 << 16, allow_inf_nan=False,
                             description="DDP's bucket_cap_mb (MiB)")
    first_bucket_mb: float = Field(default=FIRST_BUCKET_MB, gt=0, le=1 << 16,
                                   allow_inf_nan=False,
                                   description="DDP's first bucket (MiB)")

    def device_compute_ns(self, model: str, batch: int) -> int | None:
        """Forward and backward of `batch` samples on `device` (None: no device given)."""
        if self.device is None:
            return None
        return round(sum(f + b for f, b in layer_ns(layer_table(model), batch,
                                                     device=self.device)))

    def ddp(self, model: str, batch: int, bytes_per_param: int, compute_ns: int
            ) -> Overlap | None:
        """The iteration as DDP runs it, `compute_ns` shared out by the layers' FLOPs;
        None without `overlap` (compute, then the all-reduce)."""
        if not self.overlap:
            return None
        return ddp_overlap(layer_table(model), batch, bytes_per_param, self.bucket_mb,
                           self.first_bucket_mb, compute_ns=compute_ns)

    def _training(self, model: str, parallelism: object) -> None:
        """What the fields ask of the model: a layer table, and no hybrid split."""
        if self.device is None and not self.overlap:
            return
        asked = "overlap" if self.overlap else "device"
        if parallelism is not None:
            raise ValueError(f"{asked}: a hybrid split's steps hold its compute; give "
                             f"{asked} without parallelism")
        if model not in layer_models():
            raise ValueError(f"{asked}: no layer table for {model}; tables ship for "
                             f"{', '.join(layer_models())}")


class Workload(Training):
    model: ModelName | None = Field(default=None, description="required without torch_trace")
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
    torch_trace: str | None = Field(
        default=None, min_length=1, max_length=4096,
        description="a PyTorch profiler trace (Chrome JSON) of one rank's training step, "
                    "relative to this file: its compute and collectives are every rank's "
                    "(controller/base/config/recorded.py)")
    torch_trace_step: int | None = Field(default=None, ge=0, le=1 << 31,
                                         description="its ProfilerStep#N (default: the last)")

    @property
    def label(self) -> str:
        """The job's name: its model, or its trace's file name."""
        return self.model or Path(self.torch_trace or "recorded").stem[:64] or "recorded"

    @model_validator(mode="after")
    def _compute(self) -> Workload:
        if self.torch_trace is not None:
            given = [k for k in ("model", "compute_time_ms", "calibrate", "device",
                                 "parallelism") if getattr(self, k) is not None]
            if self.overlap:
                given.append("overlap")
            if given:
                raise ValueError(f"torch_trace: the trace gives the model's compute and "
                                 f"collectives; give no {', '.join(given)}")
            if self.batch_per_node is None:
                raise ValueError("batch_per_node: give it (the trace's batch, which "
                                 "counts the iterations of an epoch)")
            return self
        if self.model is None:
            raise ValueError("model: give it (or torch_trace, a recorded step)")
        _hybrid_compute(self.parallelism, self.model, self.batch_per_node,
                        self.compute_time_ms, self.calibrate is not None)
        self._training(self.model, self.parallelism)
        given = [k for k in ("compute_time_ms", "calibrate", "device")
                 if getattr(self, k) is not None]
        if self.parallelism is None and len(given) != 1:
            raise ValueError("give exactly one of compute_time_ms, calibrate or device" +
                             (f" (given: {', '.join(given)})" if given else ""))
        return self

    def samples_per_iteration(self, n_nodes: int) -> int:
        p = self.parallelism
        if p is not None:
            return p.samples_per_iteration
        assert self.batch_per_node is not None
        return self.batch_per_node * (self.ranks or n_nodes)


JOB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


MAX_JOBS = 10_000  # [[jobs]] entries plus trace rows


class JobEntry(Training):
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
        self._training(self.model, self.parallelism)
        if self.device is not None and self.compute_time_ms is not None:
            raise ValueError("give one of compute_time_ms or device")
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
    text = read_text(path)
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
                                   + ("." + fmt_loc(err["loc"]) if err["loc"] else ""),
                                   err["msg"]) for err in e.errors()]
    if issues:
        raise ConfigError(issues)
    return jobs


class NetworkSpec(ConfigModel):
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
    onn_pass_ns: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False,
                               description="optinc: one pass through a unit's ONN, added "
                                           "per level (the trained unit of 4 servers, 8 "
                                           "bits: 0.72 ns, `oddl optinc onn`); 0: the "
                                           "linear unit, whose time is not modelled")
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


class Experiment(ConfigModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="names the run directory: letters, digits, '_', '.', '-'")
    description: str = ""
    testbed: str = Field(min_length=1, description="relative to this file's directory")
    seed: int = 0
    iterations: int | None = Field(default=None, gt=0, description="override epochs")
    time_limit_s: float | None = Field(
        default=None, gt=0, le=366 * 86400, allow_inf_nan=False,
        description="a job submitted to an arbiter is stopped this long after it starts "
        "(it ends `timeout`); `oddl run` has none")
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
        default=DISTURBANCE_THRESHOLD, ge=0, le=1e6,
        description="a network's run is flagged disturbed when "
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
    recorded: Recorded | None = None  # the workload's torch_trace, read

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
    data = read_toml(path)
    if "models" in data and not is_experiment(data):
        raise ConfigError([ConfigIssue(str(path), "", "this is a sweep: run it with `oddl "
                                       "sweep`")])
    if not is_experiment(data) and {"grid", "nodes", "optical"} & set(data):
        raise ConfigError([ConfigIssue(str(path), "", "this is a testbed, not an experiment "
                                       "(`oddl check` checks either; experiments/ has "
                                       "experiments to run on it)")])
    exp = experiment_model(path, data)
    tb_path = Path(testbed) if testbed else (path.parent / exp.testbed)
    try:
        tb = load_testbed(tb_path)
    except ConfigError as e:
        if testbed or not e.issues or e.issues[0].path:
            raise
        raise ConfigError([ConfigIssue(str(path), "testbed",
                                       f"{tb_path.resolve()}: {e.issues[0].reason}")]
                          ) from None
    w = exp.workload
    recorded = read_recorded(path.parent / w.torch_trace, w.torch_trace_step) \
        if w is not None and w.torch_trace is not None else None
    return LoadedExperiment(path, exp, tb_path, tb, validate_experiment(path, exp, tb),
                            recorded)


def experiment_model(path: Path, data: dict[str, Any]) -> Experiment:
    """The experiment's schema checked: ConfigError naming each field and why."""
    if isinstance(data.get("faults"), dict):
        raise ConfigError([ConfigIssue(str(path), "faults", OLD_FAULTS)])
    try:
        return Experiment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_job_named(pydantic_issues(path, e), data)) from None
    except RecursionError:
        raise ConfigError([ConfigIssue(str(path), "", "nested too deep")]) from None


def validate_experiment(path: Path, exp: Experiment, tb: Testbed, placed: bool = False
                        ) -> tuple[JobEntry, ...]:
    """The one validation of an experiment against a testbed (`check`, `run`, `sweep`,
    the arbiter's submit): its faults, networks, flow bound, ranks, parallelism and jobs.
    `placed`: its workload gets a rectangle of the grid (the arbiter's), not the whole
    testbed. Its jobs ([[jobs]] then its trace's rows); ConfigError with every issue."""
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
            w.parallelism, w.label, w.collective, w.ranks or tb.n_nodes, tb,
            whole_grid=not placed)]
        if exp.recovery == "shrink":
            issues.append(ConfigIssue(str(path), "recovery", "a hybrid-parallel job cannot "
                                      "shrink (tensor x pipeline x data is its rank count): "
                                      "'spare' or 'relay'"))
    issues += _job_issues(path, exp, jobs, tb)
    if issues:
        raise ConfigError(issues)
    return tuple(jobs)


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
