"""The figures a run leaves behind: ours beside the paper's, an iteration taken apart, the
WSS tables as heat maps.

An iteration splits three ways (docs/model.md): compute (the workload's), communication
(the schedule's bytes at the line rate: what a perfect fabric with no control would take)
and control overhead (the rest of the all-reduce: REQUEST / GRANT / RELEASE round trips,
tuning, guard times, a switch's per-flow latency).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oddl.controller.base.collectives import Schedule
from oddl.controller.stage1.plan import Plan


def wire_ns(schedule: Schedule, line_rate_gbps: float) -> int:
    """One iteration's data time with no control at all: each step lasts as long as its
    busiest sender needs to put its bytes on one port at the line rate."""
    steps = max((len(s) for s in schedule), default=0)
    total = 0.0
    for k in range(steps):
        busiest = max((sum(b for _, b in s[k].sends) for s in schedule if k < len(s)),
                      default=0)
        total += busiest * 8 / line_rate_gbps
    return round(total)


@dataclass(frozen=True)
class PaperRow:
    """One figure of the paper's, and ours for it."""

    what: str
    ours: float | None
    paper: float
    unit: str

    @property
    def difference(self) -> str:
        if self.ours is None or not self.paper:
            return "-"
        return f"{(self.ours - self.paper) / self.paper * 100:+.2f}%"


def paper_rows(reference: Mapping[str, Any], training_min: Mapping[str, float],
               ratio: float | None) -> list[PaperRow]:
    """An experiment's [reference] as rows: `<network>_min` is that network's training
    time, `ratio` ODDL's over electrical; other numbers are shown as the paper gives them."""
    rows = []
    for k, v in reference.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        net = k.removesuffix("_min")
        if k.endswith("_min"):
            rows.append(PaperRow(f"{net} training time", training_min.get(net), float(v), "min"))
        elif k == "ratio":
            rows.append(PaperRow("ratio oddl / electrical", ratio, float(v), ""))
        else:
            rows.append(PaperRow(k, None, float(v), ""))
    return rows


def iteration_parts(store: Mapping[str, Any], training_min: Mapping[str, float]
                    ) -> dict[str, dict[str, float]]:
    """Per network of a run store (results.read_store): its mean iteration in three parts
    (ms) and its training time (min)."""
    out = {}
    for name, d in store.items():
        its = d["iterations"]
        if not its:
            continue
        comm = sum(r[4] for r in its) / len(its)  # the all-reduce: t_end - t_start - compute
        wire = min(float(d["meta"].get("wire_ns", 0)), comm)
        out[name] = {"compute_ms": sum(r[3] for r in its) / len(its) / 1e6,
                     "communication_ms": wire / 1e6, "control_ms": (comm - wire) / 1e6,
                     "training_min": training_min[name]}
    return out


def pyplot() -> Any:
    """matplotlib's pyplot, drawing into files (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLOURS = {"compute": "#9ecae1", "communication": "#3182bd", "control": "#e6550d"}


def save(fig: Any, out: Path) -> Path:
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def draw(kind: str, args: Mapping[str, Any], out: Path) -> Path:
    """A run's figure from plain data, as a helper process is sent it (plotter.py): `run`
    (title, networks as `run_figure` takes them, paper: PaperRow fields) or `jct_cdf`
    (title, jobs)."""
    if kind == "run":
        fig = run_figure(args["title"], args["networks"],
                         [PaperRow(**r) for r in args["paper"]])
    elif kind == "jct_cdf":
        fig = jct_cdf(args["title"], args["jobs"])
    else:
        raise ValueError(f"no figure {kind!r} (run, jct_cdf)")
    return save(fig, out)


def iterations_figure(title: str, iterations: Sequence[Sequence[int]],
                      stops: Sequence[Mapping[str, Any]] = ()) -> Any:
    """A job's iterations as they were recorded (store rows: iteration, t_start_ns,
    t_end_ns, ...): each one's time, and its end against the job's clock, its stops marked
    (where the arbiter was down, or a fault cut it)."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    its = [r[0] for r in iterations]
    a1.plot(its, [(r[2] - r[1]) / 1e6 for r in iterations], ".", ms=3)
    a1.set_xlabel("iteration")
    a1.set_ylabel("iteration time (ms)")
    t0 = min((r[1] for r in iterations), default=0)
    a2.plot([(r[2] - t0) / 1e9 for r in iterations], its, lw=1)
    for s in stops:
        if s.get("from_iteration") is not None:  # where a stop cut it
            a2.axhline(s["from_iteration"], color="tab:red", lw=0.8, ls="--")
    a2.set_xlabel("s from its first iteration's start: each one's end")
    a2.set_ylabel("iterations done")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def run_figure(title: str, networks: Mapping[str, Mapping[str, float]],
               paper: Sequence[PaperRow]) -> Any:
    """`networks[name]` has compute_ms, communication_ms, control_ms (a mean iteration) and
    training_min. Left: the iteration taken apart; middle: its all-reduce alone (where the
    networks differ); right: training time, ours beside the paper's."""
    plt = pyplot()
    names = list(networks)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, parts in ((a1, ("compute", "communication", "control")),
                      (a2, ("communication", "control"))):
        left = [0.0] * len(names)
        for part in parts:
            vals = [networks[n][f"{part}_ms"] for n in names]
            ax.barh(names, vals, left=left, color=COLOURS[part],
                    label="control overhead" if part == "control" else part)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        for i, v in enumerate(left):
            c = networks[names[i]]["control_ms"]
            share = c / v * 100 if v else 0.0
            ax.text(v, i, f" {v:.4g} ms\n control {c * 1e3:.4g} µs ({share:.2g}%)",
                    va="center", fontsize=8)
        ax.set_xlim(0, max(left, default=1) * 1.6 or 1)
        ax.ticklabel_format(axis="x", useOffset=False, style="plain")
        ax.set_xlabel("ms per iteration")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    a1.set_title("an iteration")
    a2.set_title("its all-reduce")
    by_net = {r.what.removesuffix(" training time"): r.paper for r in paper
              if r.unit == "min"}
    xs = range(len(names))
    ours = [networks[n]["training_min"] for n in names]
    w = 0.38 if by_net else 0.6
    b = a3.bar([x - (w / 2 if by_net else 0) for x in xs], ours, w, label="ours (model)",
               color="tab:blue")
    a3.bar_label(b, fmt="%.2f", fontsize=8)
    if by_net:
        refs = [by_net.get(n, float("nan")) for n in names]
        b = a3.bar([x + w / 2 for x in xs], refs, w, label="paper", color="tab:grey")
        a3.bar_label(b, labels=["" if r != r else f"{r:.2f}" for r in refs], fontsize=8)
        a3.legend(fontsize=8, loc="lower right")
    a3.set_xticks(list(xs), names)
    a3.set_ylabel("training time (min)")
    a3.ticklabel_format(axis="y", useOffset=False, style="plain")
    a3.set_title("training time")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plan_figure(plan: Plan, max_wss: int = 16) -> Any:
    """Each WSS's table as a heat map: input port x wavelength, coloured and labelled by
    the output port it reaches (blank where the input is blocked)."""
    import numpy as np

    plt = pyplot()
    tables = plan.wss[:max_wss]
    if not tables:
        raise ValueError("the plan has no WSS tables to draw")
    cols = min(4, len(tables))
    rows = -(-len(tables) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.6 * cols, 6.5), 3.2 * rows),
                             squeeze=False)
    for ax in axes.flat[len(tables):]:
        ax.set_axis_off()
    for ax, t in zip(axes.flat, tables, strict=False):
        n_ch = len(t.labels)
        m = np.full((t.ports, n_ch), np.nan)
        for i, row in enumerate(t.table):
            for c, o in enumerate(row[:n_ch]):
                if o is not None:
                    m[i, c] = o
        ax.imshow(m, cmap="viridis", vmin=0, vmax=max(t.ports - 1, 1), aspect="auto")
        if t.ports * n_ch <= 64:
            for (i, c), o in np.ndenumerate(m):
                if o == o:
                    ax.text(c, i, str(int(o)), ha="center", va="center", fontsize=7,
                            color="white")
        ax.set_xticks(range(n_ch), [f"{plan.wavelengths_nm[c]:.2f}\n{t.labels[c]}"
                                    for c in range(n_ch)], fontsize=6)
        ax.set_yticks(range(t.ports))
        ax.tick_params(axis="y", labelsize=6)
        ax.set_xlabel("wavelength (nm), what it realises", fontsize=7)
        ax.set_ylabel("input port", fontsize=7)
        ax.set_title(f"{t.wss} ({t.axis} {t.index}): output port", fontsize=8)
    more = f" (first {max_wss} of {len(plan.wss)})" if len(plan.wss) > max_wss else ""
    fig.suptitle(f"{plan.testbed}: WSS tables, strategy {plan.strategy}{more}")
    fig.tight_layout()
    return fig


def jct_cdf(title: str, jobs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Any:
    """Several jobs: per network, the CDF of job completion times (arrival to departure),
    and each network's queueing share of them."""
    plt = pyplot()
    nets = sorted({n for per in jobs.values() for n in per})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for n in nets:
        jct = sorted(per[n]["jct_s"] for per in jobs.values() if n in per)
        a1.step(jct, [(k + 1) / len(jct) for k in range(len(jct))], where="post", label=n)
        q = sorted(per[n]["queued_s"] for per in jobs.values() if n in per)
        a2.step(q, [(k + 1) / len(q) for k in range(len(q))], where="post", label=n)
    for ax, what in ((a1, "job completion time (s)"), (a2, "time queued (s)")):
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    a1.set_title("JCT CDF")
    a2.set_title("queueing CDF")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def partition_figure(title: str, rows: int, cols: int,
                     cells: Mapping[tuple[int, int], str]) -> Any:
    """The grid, each node coloured by the job it belongs to (`cells`: (row, col) -> job;
    blank: free)."""
    import numpy as np

    plt = pyplot()
    names = sorted(set(cells.values()))
    m = np.full((rows, cols), np.nan)
    for (r, c), job in cells.items():
        m[r, c] = names.index(job)
    side = min(12.0, max(4.0, cols * 0.3))
    fig, ax = plt.subplots(figsize=(side + 2.5, side * rows / cols + 0.8))
    cmap = plt.get_cmap("tab20", max(len(names), 1))
    ax.imshow(m, cmap=cmap, vmin=-0.5, vmax=max(len(names), 1) - 0.5, aspect="equal")
    for k, job in enumerate(names):
        rc = np.argwhere(m == k)
        (r0, c0), (r1, c1) = rc.min(0), rc.max(0)
        ax.text((c0 + c1) / 2, (r0 + r1) / 2, job, ha="center", va="center", fontsize=7,
                color="black", bbox={"facecolor": "white", "alpha": 0.6, "pad": 1,
                                     "linewidth": 0})
    ax.set_xlabel("column (column WSS)")
    ax.set_ylabel("row (row WSS)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def circle_figure(names: Sequence[str], demands: Sequence[Any], score: float,
                  perimeter_ms: float) -> Any:
    """CASSINI's picture: each job's demand around the unified circle, as rotated, and
    their sum against the link's capacity (1.0)."""
    import numpy as np

    plt = pyplot()
    fig = plt.figure(figsize=(6, 6))
    ax = fig.add_subplot(projection="polar")
    n = len(demands[0])
    theta = np.linspace(0, 2 * np.pi, n, endpoint=False)
    width = 2 * np.pi / n
    bottom = np.zeros(n)
    for name, d in zip(names, demands, strict=True):
        ax.bar(theta, d, width=width, bottom=1 + bottom, label=name, align="edge", alpha=0.8)
        bottom = bottom + np.asarray(d)
    ax.plot(np.append(theta, 0), np.full(n + 1, 2.0), color="black", lw=1,
            label="link capacity")
    ax.set_yticklabels([])
    ax.set_theta_zero_location("N")
    ax.set_theta_direction(-1)
    ax.set_title(f"unified circle ({perimeter_ms:g} ms): score {score:.3f}", fontsize=9)
    ax.legend(fontsize=7, loc="upper right", bbox_to_anchor=(1.25, 1.1))
    fig.tight_layout()
    return fig
