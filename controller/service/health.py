"""The arbiter's live inventory at run time: heartbeats in, diagnosed faults out.

Every node program sends a `Heartbeat` each `[monitor] heartbeat_ms`, read from its board's
registers (CRC errors per receiver, the ERROR flags, the last tuning time per transmitter)
and its control units (transfers nobody granted). The arbiter's `Health` keeps the last of
each, hears last wills and the WSSs' answers to a poll, and turns evidence into
`Diagnosis` rows (ODDL-SPEC stage 1, step 4):

    dead-board    NODE        silent for `missed` periods, or its last will
    corrupt-link  NODE/PORT   its CRC errors grew in `crc_periods` heartbeats in a row
    dead-wss      WSS         `missed` polls in a row unanswered, or a table other than the
                              one written
    wss-route     WSS         transfers arrive at a receiver that granted none (misrouted
                              light: the table reads back right)
    slow-tx       NODE/PORT   a transmitter took more than twice its tuning time
    unresponsive  NODE        its peers' REQUESTs time out again and again: a flow failed
                              after every retry naming it, in two attempts of the job,
                              while it still beats (once may be the bus blinking)
    broker-restart broker     every node went silent at once: the bus, not the nodes

The same code runs in every back end: on the virtual clock in sim, on the real loop for
the heartbeats that `oddl node` publishes over MQTT.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from oddl.controller.base.access import NAME_PATTERN
from oddl.controller.base.clock import Clock
from oddl.controller.base.config import Monitor, Testbed
from oddl.controller.base.devices import ONic
from oddl.controller.base.faultkinds import DIAGNOSES, avoided
from oddl.controller.base.hostload import LAG_FLOOR_NS, host_load
from oddl.controller.base.topology import Grid
from oddl.controller.stage1.planner import Avoid

log = logging.getLogger(__name__)

HEARTBEAT_VERSION = 1
_Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=64)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
_Port = Annotated[str, msgspec.Meta(pattern=r"^[HV]$")]


class Heartbeat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One node's health, from its board's registers and its control units."""

    v: int
    node: _Name
    seq: _Count
    crc_errors: Annotated[dict[_Port, _Count], msgspec.Meta(max_length=2)] = {}
    tune_ns: Annotated[dict[_Port, _Count], msgspec.Meta(max_length=2)] = {}
    error_flags: _Count = 0  # the board's ERROR register (refused transfers, route misses)
    unexpected_rx: Annotated[dict[_Port, _Count], msgspec.Meta(max_length=2)] = {}
    job: Annotated[str, msgspec.Meta(max_length=128)] = ""  # the job it runs, if any
    transmitting: bool = False  # a transmitter of its has a flow: light still to land
    # how late its host's loop has been running its timers lately (a starved host, not a
    # dying board: its silence is judged with this much more patience)
    lag_ns: _Count = 0
    sent: _Count = 0  # control messages its units have sent: a job that moves, if slowly
    # the loop that beats for it (`host_id()`): the node programs one emulator, or one
    # host, runs share it, so a sibling's fresh lag is this node's host's lag of the moment
    host: Annotated[str, msgspec.Meta(max_length=128)] = ""


# what a diagnosis makes the planner avoid
AVOID_NODE, AVOID_WSS, AVOID_LINK = avoided("node"), avoided("wss"), avoided("link")


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    target: str
    t_ns: int  # when the arbiter concluded it
    evidence: str

    def __str__(self) -> str:
        return f"{self.kind} {self.target} ({self.evidence})"


LAG_WINDOW = 8  # the controller's own ticks its lag is the worst of
WARN_EVERY_NS = 30_000_000_000  # an overloaded host is said at most this often


@dataclass
class _Node:
    last_ns: int
    beat: Heartbeat | None = None
    lag_ns: int = 0  # how late its host's loop ran, as its last heartbeat said
    host: str = ""  # the loop that beats for it (Heartbeat.host)
    back_by_ns: int = 0  # after a bus outage: not judged silent before this
    crc_rising: dict[str, int] = field(default_factory=dict)  # port -> beats in a row


class Health:
    """The live inventory: who beats, what their boards say, what is broken.

    `diagnoses` keeps every conclusion in order; a job planned when there were `since` of
    them went round those in force, and is stopped only for later ones (`pending`)."""

    watched = True  # there is something to watch (a model back end has not: `Unwatched`)

    def __init__(self, cfg: Monitor, nodes: Iterable[str], tuning_ns: int,
                 wss_of: Mapping[tuple[str, str], str]) -> None:
        """wss_of: (node, port) -> the WSS that port's light goes through."""
        self.cfg = cfg
        self.wss_of = dict(wss_of)
        self.period_ns = round(cfg.heartbeat_ms * 1e6)
        # judged every quarter period: a node is dead once its `missed`-th beat is due, so
        # it is found within `missed` periods of its death, and a live one (a beat every
        # period) would need 1.75 periods of jitter to be taken for dead
        self.tick_ns = max(1, self.period_ns // 4)
        self.silence_ns = cfg.missed * self.period_ns - self.tick_ns
        self.tuning_ns = tuning_ns
        self.nodes: dict[str, _Node] = {n: _Node(0) for n in nodes}
        self.diagnoses: list[Diagnosis] = []
        self.beats = 0
        self.rejected = 0  # heartbeats that were no heartbeat of a node of ours
        self.bus_down_since: int | None = None  # every node silent: the broker, not them
        self._seen: set[tuple[str, str]] = set()
        self._suspects: dict[str, tuple[int, str]] = {}  # peer -> (since, why)
        self._strikes: dict[str, int] = {}  # peer -> jobs cut short naming it
        self._wss_missed: dict[str, int] = {}  # WSS -> polls unanswered in a row
        self.listening = False  # the back end hears the nodes (its bus is up): `start`
        # how late the hosts' loops run: this controller's (its watch's ticks) and the
        # nodes' (their heartbeats say); a silence is judged with that much more patience
        self._own_lags: list[int] = []
        # host -> (its lag, the node that said it): the latest any of its nodes said
        self._host_lag: dict[str, tuple[int, str]] = {}
        self.max_lag_ns = {"controller": 0, "nodes": 0}
        self._warned_ns = -WARN_EVERY_NS

    @classmethod
    def of(cls, tb: Testbed, grid: Grid) -> Health:
        """The watch of a testbed's ODDL network, as every back end keeps it (the core
        builds it; each back end feeds it what it hears)."""
        return cls(tb.monitor, grid.nodes, tb.optical.tuning_ns,
                   grid.wss_of())

    # --- evidence ----------------------------------------------------------------------
    def start(self, now_ns: int) -> None:
        """The back end hears the nodes from now (sim: from its start; emu and hw: once
        its bus connection is up): a node is given `missed` periods from now to be heard.
        Before, nobody's silence is judged (a slow connect is not every node dead)."""
        self.listening = True
        for st in self.nodes.values():
            st.last_ns = max(st.last_ns, now_ns)

    def beat(self, hb: Heartbeat, now_ns: int) -> None:
        st = self.nodes.get(hb.node)
        if st is None:
            self.rejected += 1
            return
        self.beats += 1
        st.lag_ns = hb.lag_ns
        if hb.host:
            st.host = hb.host
            if hb.host in self._host_lag or len(self._host_lag) < len(self.nodes):
                self._host_lag[hb.host] = (hb.lag_ns, hb.node)
        self.max_lag_ns["nodes"] = max(self.max_lag_ns["nodes"], hb.lag_ns)
        if ("dead-board", hb.node) in self._seen:  # back (a board restarted): usable again
            log.warning("health: %s beats again", hb.node)  # from the next plan on
            self.forget("dead-board", hb.node)
            st.crc_rising.clear()
            st.beat = None
        prev = st.beat
        st.last_ns = now_ns
        st.beat = hb
        if prev is not None:
            for port, n in hb.crc_errors.items():
                rising = n > prev.crc_errors.get(port, 0)
                st.crc_rising[port] = st.crc_rising.get(port, 0) + 1 if rising else 0
                if st.crc_rising[port] >= self.cfg.crc_periods:
                    self._conclude("corrupt-link", f"{hb.node}/{port}", now_ns,
                                   f"CRC errors rose in {st.crc_rising[port]} heartbeats, "
                                   f"now {n}")
            for port, n in hb.unexpected_rx.items():
                if n > prev.unexpected_rx.get(port, 0):
                    self.misrouted(hb.node, port, now_ns)
        for port, t in hb.tune_ns.items():
            if t > 2 * self.tuning_ns:
                self._conclude("slow-tx", f"{hb.node}/{port}", now_ns,
                               f"tuning took {t} ns, spec {self.tuning_ns} ns")
        if self.bus_down_since is not None:
            log.warning("health: heartbeats again after %.1f ms: the bus is back",
                        (now_ns - self.bus_down_since) / 1e6)
            self.bus_down_since = None
            self.forget("broker-restart", "broker")
            # the others reconnect on their own back-off: `grace_ms` to be heard again
            back_by = now_ns + round(self.cfg.grace_ms * 1e6)
            for other in self.nodes.values():
                if other is not st:
                    other.back_by_ns = back_by

    def bus_lost(self, now_ns: int, why: str) -> None:
        """The arbiter's own connection to the bus broke: nobody can be heard (until a
        heartbeat comes through again)."""
        if self.bus_down_since is None:
            self.bus_down_since = now_ns
            self._conclude("broker-restart", "broker", now_ns, why)

    def will(self, node: str, now_ns: int) -> None:
        if node in self.nodes:
            self._conclude("dead-board", node, now_ns, "its last will")

    def wss_answer(self, wss: str, now_ns: int, error: str | None,
                   silent: bool = False) -> None:
        """A WSS's answer (`error`: none, or a wrong one). `silent`: it did not answer a
        poll: dead only at the `missed`-th poll in a row, as a board is after `missed`
        periods (one slow answer, a paused emulator, is not a dead WSS)."""
        if error is None:
            self._wss_missed.pop(wss, None)
            return
        if silent:
            n = self._wss_missed[wss] = self._wss_missed.get(wss, 0) + 1
            if n < self.cfg.missed:
                return
            error = f"{error} ({n} polls in a row)"
        self._conclude("dead-wss", wss, now_ns, error)

    def flow_failed(self, peer: str, now_ns: int, why: str) -> None:
        """A flow failed after all its retries to `peer`: dead, unless it still beats
        (judged by `check` once its silence could have shown)."""
        if peer in self.nodes and not self.is_dead(peer):
            self._suspects[peer] = (now_ns, why)
            self._strikes[peer] = self._strikes.get(peer, 0) + 1

    def misrouted(self, node: str, port: str, now_ns: int) -> None:
        """Someone's light arrived at `node`/`port` ungranted: that group's WSS misroutes."""
        wss = self.wss_of.get((node, port))
        if wss is not None:
            self._conclude("wss-route", wss, now_ns, f"{node}/{port} received transfers it "
                                                     f"never granted")

    def own_lag(self, lag_ns: int, now_ns: int) -> None:
        """How late this controller's loop ran its watch's tick at `now_ns`."""
        self._own_lags = [*self._own_lags[-(LAG_WINDOW - 1):], lag_ns]
        self.max_lag_ns["controller"] = max(self.max_lag_ns["controller"], lag_ns)

    def _patience(self, st: _Node) -> int:
        """What a node's silence is forgiven beyond `missed` periods: twice the lag of
        its host's loop or this one's, whichever is worse (a starved host beats late, a
        dead board never), at most `grace_ms`; nothing for lag under LAG_FLOOR_NS. Its
        host's lag is the freshest any node on that host said (`host_lag`): a node
        silent because its host stalled says nothing, but its siblings, once their loop
        runs again, say how late it ran at that moment."""
        return self.patience_ns([], max(st.lag_ns, self.host_lag(st)[0]))

    def host_lag(self, st: _Node) -> tuple[int, str]:
        """The lag its host's loop ran at, as the latest of its nodes to beat said, and
        which node said it (0, "" before any did)."""
        return self._host_lag.get(st.host, (0, "")) if st.host else (0, "")

    def patience_ns(self, nodes: Iterable[str], lag_ns: int = 0) -> int:
        """The most any of `nodes` (or a host `lag_ns` late) is forgiven (`_patience`):
        what a wait on their answers adds on a starved host."""
        lag = max(lag_ns, max(self._own_lags, default=0),
                  *(max(self.nodes[n].lag_ns, self.host_lag(self.nodes[n])[0])
                    for n in nodes if n in self.nodes))
        return 0 if lag < LAG_FLOOR_NS else min(2 * lag, round(self.cfg.grace_ms * 1e6))

    def _say_overload(self, now_ns: int) -> None:
        """Once in a while: whose host is too busy to beat in time, and what to change."""
        if now_ns - self._warned_ns < WARN_EVERY_NS:
            return
        half = self.period_ns // 2
        worst = self.max_lag_ns
        if worst["controller"] <= half and worst["nodes"] <= half:
            return  # (every quarter period: no host has ever run that late)
        own = max(self._own_lags, default=0)
        if own <= half:
            for st in self.nodes.values():
                if st.lag_ns > half:
                    break
            else:
                return  # (every quarter period: the usual answer, found without sorting)
        late = sorted(((st.lag_ns, n) for n, st in self.nodes.items() if st.lag_ns > half),
                      reverse=True)
        self._warned_ns = now_ns
        who = []
        if own > half:
            who.append(f"this controller's loop runs {own / 1e6:.0f} ms late")
        if late:
            names = ", ".join(n for _lag, n in late[:4])
            who.append((f"{len(late)} node programs' hosts run" if len(late) > 1 else
                        "1 node program's host runs") +
                       f" up to {late[0][0] / 1e6:.0f} ms late (e.g. {names})")
        log.warning("health: the host is overloaded: %s, with heartbeats due every %.0f ms: "
                    "their silences are judged with that much more patience (up to "
                    "grace_ms); free the CPU, or raise [monitor] heartbeat_ms or missed in "
                    "the testbed config", "; ".join(who), self.period_ns / 1e6)

    # --- judgement ---------------------------------------------------------------------
    def check(self, now_ns: int) -> list[Diagnosis]:
        """Silence and suspicion, judged at `now_ns`; returns new diagnoses."""
        if not self.listening:
            return []
        before = len(self.diagnoses)
        limit = self.silence_ns
        self._say_overload(now_ns)
        # (patience is never negative: a node heard within `limit` is not silent, and
        # that is every node, nearly every tick)
        silent = [n for n, st in self.nodes.items()
                  if now_ns - st.last_ns >= limit
                  and now_ns - st.last_ns >= limit + self._patience(st)
                  and now_ns >= st.back_by_ns and not self.is_dead(n)]
        alive = [n for n in self.nodes if not self.is_dead(n)] if silent else []
        # the bus demonstrably works while someone was heard within the last period
        # (and a lone node has nobody to be compared with)
        bus_ok = len(alive) == 1 or any(now_ns - self.nodes[n].last_ns <= self.period_ns
                                        for n in alive)
        if silent and bus_ok:
            for n in silent:
                quiet = f"{(now_ns - self.nodes[n].last_ns) / 1e6:.1f} ms"
                if (p := self._patience(self.nodes[n])) > 0:
                    quiet += (f", beyond {self.cfg.missed} periods and the {p / 1e6:.0f} ms a "
                              f"loaded host is given"
                              f"{self._lag_said(n, now_ns - self.nodes[n].last_ns)}")
                self._conclude("dead-board", n, now_ns, f"silent for {quiet}" if
                               self.nodes[n].beat is not None else f"never heard in {quiet} "
                               f"(is `oddl node` running beside its board?)")
        elif silent and len(silent) == len(alive) and self.bus_down_since is None:
            # nobody is heard: the broker, not every board at once
            self.bus_down_since = max(self.nodes[n].last_ns for n in silent)
            self._conclude("broker-restart", "broker", now_ns,
                           f"all {len(silent)} nodes silent for {self.cfg.missed} periods")
        for peer, (t, why) in list(self._suspects.items()):
            if self.is_dead(peer):
                del self._suspects[peer]
            elif now_ns - t >= limit and self.bus_down_since is None:
                del self._suspects[peer]  # it beats on: the second time, it does not answer
                if (now_ns - self.nodes[peer].last_ns < limit and self._strikes[peer] >= 2
                        and not self._bus_was_down(t)):
                    self._conclude("unresponsive", peer, now_ns, why)
        return self.diagnoses[before:]

    def _lag_said(self, node: str, silent_ns: int) -> str:
        """Whose lag a silence was judged against, and this host's CPU now; where that
        much lag could explain the silence (a quarter of it), it says so."""
        st = self.nodes[node]
        lag, said = self.host_lag(st)
        lag = max(lag, st.lag_ns)
        own = max(self._own_lags, default=0)
        parts = [f"its host's loop ran {lag / 1e6:.0f} ms late, as {said} said"
                 if said and said != node else f"its host's loop ran {lag / 1e6:.0f} ms late",
                 f"this controller's {own / 1e6:.0f} ms"]
        cpu = host_load()
        if cpu:
            parts.append(cpu)
        cause = cpu or 4 * max(lag, own) >= silent_ns
        return f" ({'; '.join(parts)}{': the host may be the cause' if cause else ''})"

    def _bus_was_down(self, since_ns: int) -> bool:
        return any(d.kind == "broker-restart" and d.t_ns >= since_ns - self.period_ns
                   for d in self.diagnoses)

    def _conclude(self, kind: str, target: str, now_ns: int, evidence: str) -> None:
        if (kind, target) in self._seen:
            return
        self._seen.add((kind, target))
        d = Diagnosis(kind, target, now_ns, evidence)
        self.diagnoses.append(d)
        log.warning("health: %s", d)

    def forget(self, kind: str, target: str) -> None:
        """A fault that healed (the broker back, a board back): it may be diagnosed again."""
        self._seen.discard((kind, target))

    # --- what the planner and the runner ask -------------------------------------------
    def is_dead(self, node: str) -> bool:
        return (("dead-board", node) in self._seen or ("unresponsive", node) in self._seen)

    def is_out(self, wss: str) -> bool:
        return ("dead-wss", wss) in self._seen or ("wss-route", wss) in self._seen

    def touches(self, d: Diagnosis, nodes: Collection[str]) -> bool:
        """Does `d` concern a job on `nodes`: one of them, a link of one, a WSS one of them
        sends through, or (the bus) everyone?"""
        if d.kind in AVOID_WSS:
            return any(w == d.target and n in nodes for (n, _p), w in self.wss_of.items())
        node = d.target.partition("/")[0]
        return node in nodes if node in self.nodes else True

    def pending(self, nodes: Collection[str], since: int = 0) -> list[Diagnosis]:
        """The diagnoses from the `since`-th on that concern a job on `nodes`."""
        return [d for d in self.diagnoses[since:] if self.touches(d, nodes)]

    def actionable(self, nodes: Collection[str], since: int = 0) -> list[Diagnosis]:
        """Pending diagnoses a new plan must go round (a slow transmitter is recorded, and
        a bus outage waited out, not planned round): a job beside others is stopped for
        its own faults only."""
        return [d for d in self.pending(nodes, since) if self._in_force(d)]

    def _in_force(self, d: Diagnosis) -> bool:
        """A fault a plan must go round, not since healed."""
        return DIAGNOSES.get(d.kind) is not None and (d.kind, d.target) in self._seen

    def out_of_service(self) -> set[str]:
        """The nodes a new partition must leave out: those a fault not since healed
        concerns (dead, a bad link, behind a failed WSS)."""
        live = [d for d in self.diagnoses if self._in_force(d)]
        return {n for n in self.nodes if any(self.touches(d, (n,)) for d in live)}

    def settled(self) -> bool:
        """Nothing left to conclude: no suspect is being judged."""
        return not self._suspects

    def avoid(self) -> Avoid:
        """What a plan must go round: every diagnosis not since healed."""
        now = [d for d in self.diagnoses if (d.kind, d.target) in self._seen]
        return Avoid(frozenset(d.target for d in now if d.kind in AVOID_NODE),
                     frozenset(d.target for d in now if d.kind in AVOID_WSS),
                     # (type: ignore below: NODE/PORT: two parts)
                     frozenset(tuple(d.target.split("/", 1)) for d in now  # type: ignore[misc]
                               if d.kind in AVOID_LINK))


class Unwatched(Health):
    """A model back end's health (a baseline network): nothing beats, nothing is polled,
    nothing is ever diagnosed; the runner treats it as any other."""

    watched = False

    def __init__(self) -> None:
        super().__init__(Monitor(), (), 0, {})


def host_id() -> str:
    """The loop this process runs its node programs on, as heartbeats name it: the node
    programs of one emulator, or of one host, say the same."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}"


def read_heartbeat(node: str, seq: int, onic: Any, runner: Any, lag_ns: int = 0,
                   sent: int = 0, host: str = "") -> Heartbeat:
    """What a node program reads from its board (a devices.ONic) and its control units
    (the JobRunner of the job it runs, if any) each period, and its host's loop lag."""
    h = onic.health()
    cu = runner.units.get(node) if runner is not None else None
    return Heartbeat(HEARTBEAT_VERSION, node, seq, h["crc_errors"], h["tune_ns"],
                     h["error_flags"], dict(cu.unexpected_rx) if cu is not None else {},
                     runner.spec.job if runner is not None else "",
                     cu is not None and cu.transmitting(),
                     lag_ns, sent, host)


def loop_lag_ns(clock: Clock, due_ns: int) -> int:
    """How late a timer due at `due_ns` runs: the loop's own time against the due time
    (which `clock.now_ns()` gives inside the timer). 0 on a virtual loop."""
    return max(0, clock.loop_ns() - due_ns)


class Heartbeats:
    """A node program's heartbeat: every period, read the board and send what it says.

    The ticks fall on whole periods of the clock, plus `phase_ns` while a controller
    listens (the node programs one host runs, an emulator's 64, spread over the period: a
    burst of 64 beats delayed their control messages); `slow` (no controller listens):
    every `SLOW_NS` at most, for the dashboards, all in one wake-up of their host.
    `lag_ns`: how late this host's loop ran the latest tick,
    the worst of the last `LAG_TICKS` (0 on a virtual clock), said in each heartbeat."""

    SLOW_NS = 2_000_000_000
    LAG_TICKS = 8

    def __init__(self, clock: Clock, period_ns: int, read: Callable[[int], Heartbeat | None],
                 send: Callable[[Heartbeat], None], phase_ns: int = 0) -> None:
        self.clock, self.period_ns, self.read, self.send = clock, period_ns, read, send
        self.phase_ns = phase_ns % period_ns
        self.seq = 0
        self.slow = False
        self._timer: Any = None
        self._due = 0
        self._lags: list[int] = []

    @property
    def lag_ns(self) -> int:
        return max(self._lags, default=0)

    def start(self) -> Heartbeats:
        self._tick()
        return self

    def hurry(self) -> None:
        """Beat now, and every period from here on (a controller came to listen)."""
        self.slow = False
        if self._timer is not None:
            self._timer.cancel()
            self._tick()

    def _tick(self) -> None:
        if self._due:
            self._lags = [*self._lags[-(self.LAG_TICKS - 1):], loop_lag_ns(self.clock,
                                                                           self._due)]
        hb = self.read(self.seq)
        if hb is not None:  # a dead board says nothing
            self.seq += 1
            self.send(hb)
        period, phase = (max(self.period_ns, self.SLOW_NS), 0) if self.slow else \
            (self.period_ns, self.phase_ns)
        now = max(self.clock.now_ns(), self.clock.loop_ns())  # late: no catching up
        self._due = ((now - phase) // period + 1) * period + phase
        self._timer = self.clock.call_at_ns(self._due, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Watch:
    """The arbiter's side of the watch: every period it polls each WSS in use (the
    table it wrote must read back) and judges the heartbeats."""

    def __init__(self, clock: Clock, health: Health,
                 wss: Mapping[str, Any]) -> None:
        self.clock, self.health, self.wss = clock, health, wss
        self.expected: dict[str, list[list[int | None]]] = {}  # WSS -> table written
        self._timer: Any = None
        self._ticks = 0

    def start(self) -> Watch:
        self._timer = self.clock.call_later_ns(self.health.tick_ns, self._tick)
        return self

    def _tick(self) -> None:
        now = self.clock.now_ns()
        self.health.own_lag(loop_lag_ns(self.clock, now), now)
        self._ticks += 1
        for wid, want in self.expected.items() if self._ticks % 4 == 0 else ():
            if self.health.is_out(wid):
                continue
            try:
                got = self.wss[wid].get_table()
            except Exception as e:  # no answer, or none that reads, whatever the transport
                self.health.wss_answer(wid, now, f"the poll failed: {e}", silent=True)
                continue
            self.health.wss_answer(
                wid, now, None if [list(r[: len(w)]) for r, w in zip(got, want, strict=False)]
                == want else "reads back a table other than the one written")
        self.health.check(now)
        # from the loop's now: a late tick is not followed by others that catch up (each
        # would read as the loop's lag what is the first one's)
        self._timer = self.clock.call_at_ns(max(now, self.clock.loop_ns())
                                            + self.health.tick_ns, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def landed(health: Health, onics: Mapping[str, ONic], nodes: Iterable[str],
                 grace_ns: float, settled: bool) -> bool:
    """Until no live board of `nodes` transmits (a job's last flows have landed) and, if
    `settled`, the watch has settled and the bus is back: `grace_ns` at most (a board
    that cannot be asked is the watch's to judge). Whether it came to that."""
    waited_ns = 0
    while True:
        # judged first: a board not yet found dead would be asked if it is dark
        if (not settled or (health.settled() and health.bus_down_since is None)) and not any(
                onics[n].transmitting() for n in nodes if not health.is_dead(n)):
            return True
        if waited_ns >= grace_ns:
            return False
        await asyncio.sleep(health.period_ns / 1e9)
        waited_ns += health.period_ns
