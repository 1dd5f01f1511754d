"""The acceptance suite's pytest plugin: a testbed config in, one check per device out.

Registered as the `oddl` pytest plugin (pyproject entry point), so both
`pytest tests/acceptance --testbed FILE` and `oddl accept` run it. It adds:

- `--testbed FILE`: the testbed to accept (its boards, WSSs and broker as written there;
  `oddl emulate` writes such a file for the emulated testbed);
- `--accept-report DIR`: write `summary.json` and `summary.md` with every check's figure;
- per-device parametrisation (`node`, `transmitter`, `link`, `wss_route`), so that a
  failure names the exact board, port, wavelength or WSS;
- the `bench` fixture: lazily opened drivers, a dead board failing its reachability
  check once and skipping the checks that need it (with the reason), and `figure(...)`
  to record a measured figure and the spec it was held to.

Without `--testbed` the acceptance checks skip, saying how to run them (as ARTIQ's
hardware tests do when no hardware is configured).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from oddl.app.registry import open_board
from oddl.controller.base.config import ConfigError, Testbed, load_testbed
from oddl.controller.base.topology import Grid
from oddl.drivers import cassette

NO_TESTBED = ("hardware acceptance: no --testbed given (run `oddl accept TESTBED` or "
              "`pytest tests/acceptance --testbed FILE`)")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("oddl", "oddl hardware acceptance")
    g.addoption("--testbed", default=None, help="testbed config (TOML) to accept")
    g.addoption("--accept-report", default=None, help="directory for summary.json/.md")


TESTBED = pytest.StashKey[Testbed | None]()  # the testbed under acceptance (--testbed)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "acceptance: a hardware acceptance check")
    path = config.getoption("--testbed")
    config.stash[TESTBED] = None
    _results.clear()
    if path:
        try:
            tb = load_testbed(Path(path)).expanded()
        except ConfigError as e:
            raise pytest.UsageError(f"--testbed: {e}") from None
        config.stash[TESTBED] = tb


# --- parametrisation: one check per device -------------------------------------------------

def _transmitters(tb: Testbed, grid: Grid) -> list[tuple[str, str]]:
    return [(n, p) for n in grid.nodes for p in ("H", "V") if grid.group_of(n, p).wss]


def _routes(tb: Testbed, grid: Grid) -> list[tuple[str, int, int]]:
    n_ch = len(tb.optical.wavelengths())
    return [(w.id, i, ch) for w in tb.wss for i in range(len(_members(grid, w.id)))
            for ch in range(n_ch)]


def _members(grid: Grid, wss: str) -> tuple[str, ...]:
    for n in grid.nodes:
        for p in ("H", "V"):
            g = grid.group_of(n, p)
            if g.wss == wss:
                return g.members
    return ()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    tb: Testbed | None = metafunc.config.stash[TESTBED]
    names = [n for n in ("node", "transmitter", "link", "wss_route")
             if n in metafunc.fixturenames]
    if not names:
        return
    if tb is None:
        metafunc.parametrize(names[0], [pytest.param(None, marks=pytest.mark.skip(
            reason=NO_TESTBED))], ids=["no-testbed"])
        return
    grid = Grid.from_testbed(tb)
    name = names[0]
    if name == "node":
        values: list[Any] = [n.id for n in tb.nodes]
        ids = values
    elif name in ("transmitter", "link"):
        values = _transmitters(tb, grid)
        ids = [f"{n}/{p}" for n, p in values]
    else:
        values = _routes(tb, grid)
        ids = [f"{w}:in{i}/ch{c}" for w, i, c in values]
    metafunc.parametrize(name, values, ids=ids)


# --- the bench: connections to the testbed's devices ----------------------------------------

class Unreachable(RuntimeError):
    """A board the config names that does not answer (the message says why)."""


class Absent(Unreachable):
    """The config names no board for the node: its checks skip (nothing to hold it to)."""


@dataclass
class Bench:
    tb: Testbed
    grid: Grid
    boards: dict[str, Any] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    wss_drivers: dict[str, Any] = field(default_factory=dict)
    loaded: dict[str, list[list[int | None]]] = field(default_factory=dict)

    @property
    def spec(self) -> Any:
        return self.tb.acceptance

    def connect(self, node: str) -> Any:
        """The node's O-NIC driver; Unreachable (cached) if the board does not answer."""
        if node in self.boards:
            return self.boards[node]
        if node in self.dead:
            raise Unreachable(self.dead[node])
        addr = {n.id: n.board for n in self.tb.nodes}[node]
        if not addr:
            self.dead[node] = f"{node}: no board address in the testbed config"
            raise Absent(self.dead[node])
        try:
            drv = open_board(addr, node, list(self.grid.nodes))
        except Exception as e:  # any failure to reach it is the finding
            self.dead[node] = f"board {node} ({addr}): {e}"
            raise Unreachable(self.dead[node]) from None
        self.boards[node] = drv
        return drv

    def board(self, node: str) -> Any:
        """For checks that need a board: skip (naming the failed check) if it is dead."""
        try:
            return self.connect(node)
        except Absent as e:
            pytest.skip(str(e))
        except Unreachable as e:
            pytest.skip(f"needs {node}, which is unreachable ({e}); see test_board_reachable")

    def wss(self, wid: str) -> Any:
        if wid not in self.wss_drivers:
            from oddl.drivers.wss import open_wss

            port = {w.id: w.serial for w in self.tb.wss}[wid]
            if not port:
                pytest.fail(f"WSS {wid}: no serial port in the testbed config", pytrace=False)
            self.wss_drivers[wid] = open_wss(wid, port, timeout=self.spec.timeout_s)
        return self.wss_drivers[wid]

    def load_table(self, wid: str, table: list[list[int | None]]) -> None:
        if self.loaded.get(wid) != table:
            drv = self.wss(wid)
            drv.set_table(table)
            self.loaded[wid] = table

    def close(self) -> None:
        for d in self.wss_drivers.values():
            d.close()


@pytest.fixture(scope="session")
def bench(request: pytest.FixtureRequest) -> Iterator[Bench]:
    tb = request.config.stash[TESTBED]
    if tb is None:
        pytest.skip(NO_TESTBED)
    b = Bench(tb, Grid.from_testbed(tb))
    yield b
    b.close()


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Any:
    """figure(name, value, unit, spec): the measured figure, recorded in every report
    (JUnit properties, summary.json, summary.md) whether the check passes or not."""

    def record(name: str, value: Any, unit: str = "", spec: str = "") -> None:
        request.node.user_properties.append(
            ("figure", json.dumps({"name": name, "value": value, "unit": unit,
                                   "spec": spec})))

    return record


def wait_until(pred: Any, timeout_s: float, what: str) -> None:
    """Poll a device condition (a real wait on a real or emulated device, not a test sleep)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: no answer within {timeout_s} s", pytrace=False)
        time.sleep(0.0005)


# --- reports ---------------------------------------------------------------------------------

def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "acceptance" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        msg = ""
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            msg = crash.message if crash is not None else str(report.longrepr)
            msg = msg.removeprefix("Failed: ")
        elif report.skipped and isinstance(report.longrepr, tuple):
            msg = report.longrepr[2].removeprefix("Skipped: ")
        figs = [json.loads(str(v)) for k, v in report.user_properties if k == "figure"]
        _results.append({"check": report.nodeid.split("::", 1)[-1], "file":
                         report.nodeid.split("::", 1)[0], "outcome": report.outcome,
                         "message": msg, "figures": figs,
                         "duration_s": round(report.duration, 4)})


_results: list[dict[str, Any]] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = session.config.getoption("--accept-report")
    tb = session.config.stash[TESTBED]
    if not out or tb is None:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    counts = {k: sum(1 for r in _results if r["outcome"] == k)
              for k in ("passed", "failed", "skipped")}
    summary = {"testbed": tb.name, "backend": tb.testbed.backend,
               "verdict": "FAIL" if counts["failed"] else "PASS" if counts["passed"]
               else "NOTHING CHECKED",
               "counts": counts, "checks": _results}
    if isinstance(cassette.active, cassette.Player):  # no device was reached: say so
        summary["replayed_from"] = str(cassette.active.path)
    (d / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (d / "summary.md").write_text(markdown(summary))


def markdown(summary: dict[str, Any]) -> str:
    c = summary["counts"]
    played = f", replayed from {summary['replayed_from']}" if "replayed_from" in summary \
        else ""
    lines = [f"# Acceptance: {summary['testbed']} ({summary['backend']}{played}): "
             f"**{summary['verdict']}**", "",
             f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped", "",
             "| check | result | figure | spec | message |", "|---|---|---|---|---|"]
    for r in summary["checks"]:
        figs = r["figures"] or [{"name": "", "value": "", "unit": "", "spec": ""}]
        for i, f in enumerate(figs):
            val = f"{f['name']} = {f['value']} {f['unit']}".strip() if f["name"] else ""
            head = (f"`{r['check']}`", r["outcome"].upper()) if i == 0 else ("", "")
            msg = r["message"].replace("|", "\\|").replace("\n", " ") if i == 0 else ""
            lines.append(f"| {head[0]} | {head[1]} | {val} | {f['spec']} | {msg} |")
    return "\n".join(lines) + "\n"


# --- measurements shared with bench/ (request_grant_rtt lives with the bus) ----------------


class Spread(NamedTuple):
    """A measurement's median and tail (ms)."""
    p50: float
    p99: float


def spread(xs_s: list[float]) -> Spread:
    """The median and p99 of samples in seconds, in ms (none: zero)."""
    if not xs_s:
        return Spread(0.0, 0.0)
    return Spread(1e3 * statistics.median(xs_s), 1e3 * percentile(xs_s, 0.99))


def host_explains(figure: Spread, lag: Spread, limit_ms: float) -> bool:
    """A figure whose tail is over its limit that this host's own lateness accounts for:
    with the host's loop lag (measured beside it) taken off, its tail and its median are
    within the limit. The tail alone let a broker slow on every message pass as the
    host's: a median of 788 times the limit, skipped for a tail lag of 1.9 ms."""
    return (figure.p99 > limit_ms and lag.p99 > 0 and figure.p99 - lag.p99 <= limit_ms
            and figure.p50 - lag.p50 <= limit_ms)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]
