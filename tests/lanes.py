"""The suite's two lanes on one machine (a pytest-xdist scheduler and its workers' setup).

The realtime tests (brokers, emulators, watches and time-outs on the wall clock) run on
workers of their own at the normal priority; every other test runs on workers that lowered
their own priority (`nice`), so they take only the CPU the realtime lane leaves. Before,
four equal workers on two cores kept 6 to 7.5 tasks waiting for a CPU: the emulators' node
programs then ran seconds late, their watches declared boards dead and their flows ran
out of REQUEST retries (CI failed four realtime tests so, each saying "the host may be the
cause"), although the same tests passed alone. Lowering a process's priority needs no
privilege; raising it back would, so a worker keeps its lane for the whole run.

A scope is a module's tests (or a class's), as `--dist loadscope` groups them: a module's
shared emulator stays on one worker. A scope is realtime if any of its tests is marked so;
the workers write which tests are (collection happens on them, not here) to a folder the
controller names. A run with no realtime test at all (`-m "not realtime"`) uses every
worker for the rest; a run with nothing else uses the realtime lane only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

NICE = 15  # the batch lane's niceness: a weight of 36 against the realtime lane's 1024
REALTIME = "realtime"


def lane_of(worker_id: str, workers: int) -> str:
    """Half the workers (at least one) are the realtime lane: gw0, gw1 of four."""
    return REALTIME if int(worker_id.removeprefix("gw")) < max(1, workers // 2) else "batch"


class LaneScheduling(LoadScopeScheduling):
    """`--dist loadscope`, each scope on a worker of its lane."""

    def __init__(self, config: pytest.Config, log: Any = None, folder: Path | None = None
                 ) -> None:
        super().__init__(config, log)
        self.folder = folder
        self.realtime_scopes: set[str] = set()

    def _lane(self, node: WorkerController) -> str:
        return lane_of(node.gateway.id, self.numnodes)

    def _takes(self, node: WorkerController, scope: str) -> bool:
        if not self.realtime_scopes:  # no realtime test in this run: any worker
            return True
        realtime = scope in self.realtime_scopes
        if self._lane(node) == REALTIME:
            return realtime
        # a batch worker takes a realtime scope only if no realtime worker is left (they
        # crashed): slower then, but the run ends
        return not realtime or not any(self._lane(n) == REALTIME and not n.shutting_down
                                       for n in self.nodes)

    def _next_scope(self, node: WorkerController) -> str | None:
        return next((s for s in self.workqueue if self._takes(node, s)), None)

    def _assign_work_unit(self, node: WorkerController) -> None:
        scope = self._next_scope(node)
        assert scope is not None
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid)
                                for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        # more than two tests in hand, as loadscope keeps (a worker holds its last test
        # until it is given another or told to shut down)
        while self._pending_of(self.assigned_work[node]) <= 2:
            if self._next_scope(node) is None:
                node.shutdown()
                return
            self._assign_work_unit(node)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        realtime = realtime_tests(self.folder)
        queue: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            scope = self._split_scope(nodeid)
            queue.setdefault(scope, {})[nodeid] = False
            if nodeid in realtime:
                self.realtime_scopes.add(scope)
        # the larger scopes first, as loadscope does (`--no-loadscope-reorder`: as collected)
        order = sorted(queue, key=lambda s: -len(queue[s])) \
            if self.config.option.loadscopereorder else list(queue)
        self.workqueue = OrderedDict((s, queue[s]) for s in order)
        for node in self.nodes:
            self._reschedule(node)


def realtime_tests(folder: Path | None) -> set[str]:
    """The realtime tests, as the first worker to finish collecting wrote them."""
    for f in sorted(folder.glob("*.json")) if folder is not None else ():
        try:
            return set(json.loads(f.read_text()))
        except (OSError, ValueError):  # (another worker's, being written)
            continue
    return set()


def _folder(config: pytest.Config) -> Path:
    folder = getattr(config, "_oddl_lanes", None)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="oddl-lanes-"))
        config._oddl_lanes = folder  # type: ignore[attr-defined]
    return folder


def _lanes(config: pytest.Config) -> bool:
    """Lanes where loadscope's scopes are spread over two workers or more."""
    return config.getvalue("dist") == "loadscope" and \
        config.getvalue("numprocesses") not in (0, 1, None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LaneScheduling | None:
    return LaneScheduling(config, log, _folder(config)) if _lanes(config) else None


def pytest_configure_node(node: WorkerController) -> None:
    if _lanes(node.config):
        node.workerinput["oddl_lanes"] = str(_folder(node.config))


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_oddl_lanes", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """A batch worker lowers its own priority, once, before its first test."""
    wi = getattr(config, "workerinput", None)
    if wi is not None and "oddl_lanes" in wi and \
            lane_of(wi["workerid"], int(wi["workercount"])) != REALTIME:
        os.nice(NICE)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wi = getattr(config, "workerinput", None)
    if wi is None or "oddl_lanes" not in wi:
        return
    folder = Path(wi["oddl_lanes"])
    tmp = folder / f".{wi['workerid']}.tmp"
    tmp.write_text(json.dumps([i.nodeid for i in items if REALTIME in i.keywords]))
    tmp.replace(folder / f"{wi['workerid']}.json")  # whole, or not there
