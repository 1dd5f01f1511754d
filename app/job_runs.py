"""A submitted job's run directory, `STATE/runs/ID/`, in `oddl run`'s layout, written as the
job runs: `experiment.toml` (what was submitted), `manifest.json`, `results.sqlite` (its
iterations and their flows, and at the end its outcome, its disturbance counters; read
with `read_store`, as any run's) and, once it has ended, `summary.json` (its record, as
`oddl wait --json` gives it) and, a moment later, `plot.png` (its iterations, its stops
marked; drawn off the arbiter's loop). A restarted arbiter goes on writing the same
directory. A directory that cannot be written is said in the log and the job runs on: the
ledger is the record; this is its copy for the lab's tools.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from oddl.app.experiments.figures import iterations_figure, save
from oddl.app.experiments.results import FlowRow, RunStore, read_store, reading, write_manifest
from oddl.controller.base.config import DISTURBANCE_THRESHOLD
from oddl.controller.service.backend import disturbed
from oddl.controller.service.jobs import JobRequest

log = logging.getLogger(__name__)
NETWORK = "oddl"  # a submitted job runs on the testbed's ODDL network


class JobRuns:
    def __init__(self, state: Path, plots: bool = True) -> None:
        self.root = state / "runs"
        self.plots = plots  # each ended job's plot.png
        self._open: dict[str, RunStore] = {}
        # plots are drawn beside the API, one at a time (pyplot is not thread-safe): a
        # plot takes most of a second, and the arbiter's loop must not wait for it
        self._plots = ThreadPoolExecutor(1, thread_name_prefix="oddl-job-plot")

    def path(self, job: str) -> Path:
        return self.root / job

    def begin(self, job: str, user: str, req: JobRequest, text: str) -> None:
        """At submission: the experiment as submitted, and the manifest."""
        try:
            d = self.path(job)
            d.mkdir(parents=True, exist_ok=True)
            (d / "experiment.toml").write_text(text)
            write_manifest(d, {"experiment": d / "experiment.toml"},
                           {"job": job, "user": user, "request": asdict(req)})
        except OSError as e:
            log.warning("job %s: its run directory cannot be written: %s", job, e)

    def iteration(self, job: str, i: int, t_start: int, t_end: int, compute_ns: int,
                  control_messages: int, flows: list[FlowRow]) -> None:
        """One iteration and its flows (each as the rank it was delivered to reported it),
        written before the ledger's record of it: a kill between the two leaves it here
        but not there, and the job, resumed from the ledger, runs it again and replaces
        it (the other way round, the run directory lost that iteration for good)."""
        store = self._store(job)
        try:
            if store is not None:
                store.add_iteration(NETWORK, i, t_start, t_end, compute_ns,
                                    control_messages, flows, replace=True)
        except sqlite3.Error as e:
            log.warning("job %s: iteration %d not written to its run directory: %s", job,
                        i, e)

    def flows(self, job: str, after: int, limit: int) -> list[list[Any]]:
        """The job's flow rows after row `after`, `limit` at most, each led by its row
        number (read-only: the arbiter may be writing)."""
        path = self.path(job) / "results.sqlite"
        if not path.is_file():
            return []
        try:
            db = sqlite3.connect(reading(path), uri=True)
            try:
                return [list(r) for r in db.execute(
                    "SELECT rowid, iteration, flow, step, src, dst, bytes, hops, t_submit_ns, "
                    "t_deliver_ns FROM flows WHERE rowid > ? ORDER BY rowid LIMIT ?",
                    (after, limit))]
            finally:
                db.close()
        except sqlite3.Error as e:
            log.warning("job %s: its flows cannot be read: %s", job, e)
            return []

    def end(self, job: str, record: dict[str, Any], disturbance: dict[str, int],
            control_messages: int) -> None:
        """The job's outcome into its store (disturbed as `oddl run` judges a network, at
        the default `disturbance_threshold`), its record into summary.json; the store
        closed."""
        store = self._store(job)
        try:
            if store is not None:
                store.set_outcome(NETWORK, disturbed(disturbance, control_messages,
                                                     DISTURBANCE_THRESHOLD), disturbance)
            (self.path(job) / "summary.json").write_text(json.dumps(record, indent=1))
        except (OSError, sqlite3.Error) as e:
            log.warning("job %s: its run directory cannot be written: %s", job, e)
            return
        finally:
            self.close(job)  # before the plot reads it
        if not self.plots:
            return
        with contextlib.suppress(RuntimeError):  # stopping: no new plot is begun
            self._plots.submit(self._plot, job, record)

    def _plot(self, job: str, record: dict[str, Any]) -> None:
        try:
            rows = read_store(self.path(job) / "results.sqlite")[NETWORK]["iterations"]
            if rows:
                save(iterations_figure(f"job {job} ({record.get('state')})", rows,
                                       record.get("stops") or []),
                     self.path(job) / "plot.png")
        except Exception as e:  # a plot is a convenience: the record is whole without it
            log.warning("job %s: its plot cannot be drawn: %s", job, e)

    def close(self, job: str | None = None) -> None:
        """One job's store closed; or, at the service's stop, every store, once the plots
        under way are drawn."""
        if job is None:
            self._plots.shutdown(wait=True)
        for name in [job] if job is not None else list(self._open):
            if (store := self._open.pop(name, None)) is not None:
                store.close()

    def _store(self, job: str) -> RunStore | None:
        store = self._open.get(job)
        if store is None and self.path(job).is_dir():
            try:
                store = self._open[job] = RunStore(self.path(job) / "results.sqlite")
                store.begin_network(NETWORK, NETWORK, {"job": job})
            except (OSError, RuntimeError, sqlite3.Error) as e:
                log.warning("job %s: its results store cannot be opened: %s", job, e)
                return None
        return store
