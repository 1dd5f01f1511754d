"""An independent monitor of ODDL-SPEC's invariants, for every back end.

It watches what a back end can show it: the physical layer where there is a model of it
(the fabric reports every send and arrival), the control bus (every GRANT delivered) and
the deliveries; never the control units' own state. In `raise` mode it raises at the
instant of a violation. Flow ids are per job: `new_job` starts a job's books once, however
many node programs of one testbed share the monitor.

Several jobs at once (docs/multijob.md) carry their job's tag in their flow ids' high bits
(`TAG_SHIFT`); the checker is told each job's nodes, and any flow sent from, relayed by or
landing on another job's node, or lighting a (WSS output, channel) another running job
lit, is a violation: ODDL promises each job physically isolated resources.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from oddl.controller.base.messages import ControlMessage, Flow, Grant
from oddl.controller.base.throttle import worth_logging

log = logging.getLogger(__name__)


class InvariantViolation(AssertionError):
    pass


TAG_SHIFT = 40  # flow id = tag << TAG_SHIFT | the job's own flow number
MAX_TAG = (1 << 16) - 1


def tag_of(flow_id: int) -> int:
    return flow_id >> TAG_SHIFT


@dataclass
class InvariantChecker:
    mode: str = "raise"  # "raise" | "record"
    violations: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)  # the job each violation concerns
    # (node, port) -> (flow, hop, channel) of the last GRANT that node received on that port
    grants: dict[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)
    # (flow, hop) -> the receiver node that granted it, until its light arrives
    granted_by: dict[tuple[int, int], str] = field(default_factory=dict)
    started: dict[int, tuple[str, int]] = field(default_factory=dict)  # flow -> (dst, bytes)
    delivered: set[int] = field(default_factory=set)
    checks: int = 0
    job: str = ""
    sees_light: bool = False  # a fabric model reports sends, light and arrivals to it
    # one node's view (a node program on hardware): it sees the flows its node starts and
    # the ones that arrive there, not what the other nodes start
    partial: bool = False
    owner: dict[str, int] = field(default_factory=dict)  # node -> tag of the job on it
    names: dict[int, str] = field(default_factory=dict)  # tag -> running job
    lit: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (wss, out, ch) -> tag
    cut: set[int] = field(default_factory=set)  # tags of jobs stopped before their end

    def new_job(self, job: str, tag: int = 0, nodes: Iterable[str] = ()) -> None:
        """A long-running testbed forgets the last job's flows (its findings stay in
        `violations`); a second call for the same job changes nothing. A tagged job runs
        beside others on `nodes`: nothing of theirs is forgotten, the nodes are its own
        (a new attempt of it, after a stop, starts its books afresh)."""
        if tag:
            if self.names.get(tag, job) != job:  # the same job again after a stop: the
                self._forget(tag)  # flows cut short run again, under the same ids
            self.names[tag] = job
            for n in nodes:
                self.owner[n] = tag
            return
        if job == self.job:
            return
        self.job = job
        self.grants.clear()
        self.granted_by.clear()
        self.started.clear()
        self.delivered.clear()

    def job_left(self, tag: int, t_ns: int) -> None:
        """A tagged job is over: every flow it started must have arrived (where this
        checker sees every arrival); its nodes and lights are free (its flows' books go
        with it). Again for the same job: nothing left to check."""
        mine = {f for f in self.started if tag_of(f) == tag}
        missing = [] if self.partial else sorted(mine - self.delivered)
        if missing:
            self.violation(t_ns, f"job {self.names.get(tag, tag)}: {len(missing)} started "
                                 f"flows never delivered, e.g. {missing[:5]}",
                           job=self.names.get(tag, str(tag)))
        self._forget(tag)

    def job_cut(self, tag: int) -> None:
        """A tagged job stopped before its end (cancelled, failed, stopped for a fault):
        its nodes and lights are free for the next job (issue 44: a cancelled job's lights
        stayed booked, and the next job on its WSS ports was found sharing them). Its
        flows' books stay (its other nodes' last flows are still checked) until its tag is
        given to another job; its stragglers book no light."""
        if tag in self.names:
            self.cut.add(tag)
            self.owner = {n: t for n, t in self.owner.items() if t != tag}
            self.lit = {k: t for k, t in self.lit.items() if t != tag}

    def _forget(self, tag: int) -> None:
        """A tagged job's books go: its flows, nodes and lights."""
        mine = {f for f in self.started if tag_of(f) == tag} | \
            {f for f in self.delivered if tag_of(f) == tag}
        for f in mine:
            self.started.pop(f, None)
        self.delivered -= mine
        self.owner = {n: t for n, t in self.owner.items() if t != tag}
        self.lit = {k: t for k, t in self.lit.items() if t != tag}
        self.names.pop(tag, None)
        self.cut.discard(tag)

    def _foreign(self, t_ns: int, node: str | None, flow: Flow, what: str) -> None:
        """A flow on a node another running job owns: they share a relay or receiver."""
        tag = tag_of(flow.id)
        other = self.owner.get(node) if node is not None else None
        if other is not None and other != tag:
            self.violation(t_ns, f"{node}: {what} {flow!r} of job {self.names.get(tag, tag)} "
                                 f"on a node of job {self.names.get(other, other)}: "
                                 f"jobs share it", flow.id)

    def violation(self, t_ns: int, what: str, flow: int | None = None,
                  job: str | None = None) -> None:
        """Record (and log) a violation: when, what and where, and the job it concerns
        (`job`, or the one whose tag `flow` carries; `jobs` keeps it beside each)."""
        if job is None:
            job = (self.names.get(tag_of(flow)) if flow is not None else None) or self.job
        msg = f"t={t_ns} ns: {what}" + (f" [job {job}]" if job else "")
        self.violations.append(msg)
        self.jobs.append(job)
        if len(self.violations) <= 20 or worth_logging(len(self.violations)):
            log.warning("invariant violation: %s (%d so far)", msg, len(self.violations))
        if self.mode == "raise":
            raise InvariantViolation(msg)

    def of_job(self, job: str, since: int = 0) -> list[str]:
        """The violations from the `since`-th on that concern `job` (or no job at all)."""
        return [v for v, j in zip(self.violations[since:], self.jobs[since:], strict=True)
                if j in (job, "")]

    def count_of(self, jobs: Iterable[str]) -> int:
        """The violations that concern one of `jobs` (a job's attempts) by name."""
        mine = set(jobs)
        return sum(1 for j in self.jobs if j in mine)

    # bus tap: called for every message actually delivered
    def on_message(self, dst: str, m: ControlMessage) -> None:
        if type(m) is Grant:
            self.grants[(dst, m.port)] = (m.flow, m.hop, m.channel)
            self.granted_by[(m.flow, m.hop)] = m.src

    def flow_started(self, flow: Flow) -> None:
        if flow.id in self.started:
            self.violation(flow.t_submit, f"flow {flow.id} started twice", flow.id)
        self.started[flow.id] = (flow.dst, flow.nbytes)

    def on_send(self, t_ns: int, node: str, port: str, channel: int | None, tuning: bool,
                busy: bool, flow: Flow) -> None:
        self.checks += 1
        if self.owner:
            self._foreign(t_ns, node, flow, "sends")
        if busy:
            self.violation(t_ns, f"{node}/{port}: transmitter sends {flow!r} while sending",
                           flow.id)
        if tuning:
            self.violation(t_ns, f"{node}/{port}: transmitter sends {flow!r} while tuning",
                           flow.id)
        g = self.grants.get((node, port))
        if g is None or g[0] != flow.id or g[1] != flow.hop:
            self.violation(t_ns, f"{node}/{port}: sends {flow!r} without a GRANT for it", flow.id)
        elif g[2] != channel:
            self.violation(t_ns, f"{node}/{port}: sends {flow!r} on channel {channel}, "
                                 f"granted channel {g[2]}", flow.id)

    def on_light(self, t_ns: int, wss: str, out: int | None, channel: int | None,
                 occupied_by: Flow | None, rx_busy_with: Flow | None, flow: Flow,
                 to_node: str | None = None) -> None:
        granter = self.granted_by.pop((flow.id, flow.hop), None)
        if self.owner:
            self._foreign(t_ns, to_node, flow, "receives")
            if out is not None and channel is not None and tag_of(flow.id) not in self.cut:
                tag = tag_of(flow.id)
                had = self.lit.setdefault((wss, out, channel), tag)
                if had != tag and had in self.names:
                    self.violation(t_ns, f"{wss}: (out {out}, channel {channel}) carries light "
                                         f"of jobs {self.names[had]} and "
                                         f"{self.names.get(tag, tag)}: jobs share it", flow.id)
        if to_node is not None and granter is not None and granter != to_node:
            self.violation(t_ns, f"{wss}: {flow!r} lands on {to_node} but {granter} granted it "
                                 f"(misrouted)", flow.id)
        if out is None:
            self.violation(t_ns, f"{wss}: {flow!r} sent on channel {channel} into a blocked "
                                 f"input (the light goes nowhere)", flow.id)
        elif occupied_by is not None:
            self.violation(t_ns, f"{wss}: (out {out}, channel {channel}) carries {flow!r} and "
                                 f"{occupied_by!r} at once", flow.id)
        if rx_busy_with is not None:
            self.violation(t_ns, f"{wss} out {out}: receiver gets {flow!r} while receiving "
                                 f"{rx_busy_with!r}", flow.id)

    def on_arrival(self, t_ns: int, node: str, flow: Flow, nbytes: int) -> None:
        if flow.dst != node:
            return  # a relay leg; the final leg is what counts
        if flow.id in self.delivered:
            self.violation(t_ns, f"{node}: {flow!r} delivered twice", flow.id)
        if flow.id not in self.started:
            if not self.partial:
                self.violation(t_ns, f"{node}: {flow!r} arrived but was never started", flow.id)
            self.delivered.add(flow.id)
            return
        _dst, size = self.started[flow.id]
        if nbytes != size:
            self.violation(t_ns, f"{node}: {flow!r} arrived with {nbytes} of {size} bytes", flow.id)
        self.delivered.add(flow.id)

    def undelivered(self) -> list[int]:
        return sorted(set(self.started) - self.delivered)

    def finish(self, t_ns: int) -> None:
        missing = self.undelivered()
        if missing:
            self.violation(t_ns, f"{len(missing)} started flows never delivered, e.g. "
                                 f"{missing[:5]}")
