"""`oddl arbiter` (the service that owns a testbed) and its clients: `oddl submit`, `jobs`,
`status`, `cancel`, `requeue`, `update`, `wait`, `logs`, `usage`, and an operator's `hold`,
`release`, `priority`, `drain`, `resume`, `maintenance`, `user` and `token`. The clients find
the service by `--arbiter URL --token-file F`, or ODDL_ARBITER and ODDL_TOKEN_FILE; each
waits for an arbiter that is down (restarting) up to $ODDL_ARBITER_PATIENCE seconds (120)."""

from __future__ import annotations

import functools
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from oddl.app.cli.main import _config_fail, emit, main
from oddl.controller.base.config import ConfigError

if TYPE_CHECKING:
    from oddl.app.experiments.remote import ArbiterClient




class _Seconds(click.ParamType):  # type: ignore[type-arg]  # generic since click 8.2; 8.1 is not
    """Seconds, finite and above 0 (click's FloatRange lets nan through)."""

    name = "seconds"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            v = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(v) or not 0 < v <= 1e9:
            self.fail(f"{value!r}: seconds above 0, at most 1e9", param, ctx)
        return v


_SECONDS = _Seconds()

@main.command()
@click.argument("testbed", type=click.Path(path_type=Path))
@click.option("--state", "state", type=click.Path(path_type=Path), required=True,
              help="its state directory: the job ledger (SQLite) and the users' tokens")
@click.option("--user", "users", multiple=True, required=True,
              help="NAME[:ROLE], role operator, user (default) or observer (repeatable)")
@click.option("--port", type=click.IntRange(0, 65535), default=8060, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="beyond loopback only with --tls-cert and --tls-key")
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(path_type=Path), default=None)
@click.option("--limits", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="a TOML of time limits and each role's or user's limits (docs/arbiter.md)")
@click.option("--plots/--no-plots", default=True, show_default=True, envvar="ODDL_PLOT",
              show_envvar=True,
              help="draw each ended job's plot.png into its run directory (most of a second "
                   "of CPU a job, beside the API)")
def arbiter(testbed: Path, state: Path, users: tuple[str, ...], port: int, host: str,
            tls_cert: Path | None, tls_key: Path | None, limits: Path | None,
            plots: bool) -> None:
    """The long-lived service that owns a testbed (emu or hw): people submit jobs to it,
    which run at once in isolated partitions; it survives its own crash (docs/arbiter.md)."""
    from oddl.app.queue import serve
    from oddl.app.stores import StoreError
    from oddl.controller.service.lock import TestbedBusy

    try:
        serve(testbed, state, list(users), host, port,
              (tls_cert, tls_key) if tls_cert and tls_key else None,
              say=lambda line: click.echo(line), limits=limits, plots=plots)
    except ConfigError as e:
        _config_fail(e)
    except (ValueError, TestbedBusy, StoreError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(3 if isinstance(e, TestbedBusy) else 2)


def _client_options(f: Any) -> Any:
    f = click.option("--arbiter", "url", envvar="ODDL_ARBITER", required=True,
                     help="the service's URL (or ODDL_ARBITER)")(f)
    return click.option("--token-file", envvar="ODDL_TOKEN_FILE", required=True,
                        type=click.Path(path_type=Path),
                        help="your token (or ODDL_TOKEN_FILE)")(f)


@functools.cache
def _client(url: str, token_file: Path) -> ArbiterClient:
    """One a command: `wait`'s polls keep their connection."""
    from oddl.app.experiments.remote import ArbiterClient

    return ArbiterClient(url, token_file)


def _call(url: str, token_file: Path, method: str, path: str,
          body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request; a refusal is said, with the service's reason, and exits 2."""
    from oddl.controller.service.backend import RunFailed

    try:
        return _client(url, token_file).call(method, path, body)
    except RunFailed as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


@main.command()
@click.argument("experiment", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--priority", type=click.IntRange(-1000, 1000), default=0, show_default=True)
@click.option("--time-limit", "time_limit", type=_SECONDS,
              default=None, help="seconds from its start (else the file's time_limit_s, else "
              "the arbiter's default); past it the job ends `timeout`")
@click.option("--after", default=None, metavar="JOB[:ok|:notok]",
              help="start only once JOB has ended (with :ok, finished; with :notok, failed, "
                   "cancelled or out of time: else this one is cancelled)")
@click.option("--singleton", is_flag=True,
              help="start only after every earlier job of yours of the same name (the "
                   "experiment's `name`) has ended")
@click.option("--webhook", default=None, metavar="URL",
              help="POST the job's end (JSON) to URL; under an address the arbiter allows "
                   "([notices] allow in its limits file)")
@click.option("--array", default=None, metavar="SPEC",
              help="an array of jobs, one a value (0-15, 0-15:4, 1,3,9), ID_N each with "
                   "seed = N; `oddl wait ID` and `oddl cancel ID` take them as one")
@click.option("--json", "as_json", is_flag=True)
@_client_options
def submit(experiment: Path, priority: int, time_limit: float | None, after: str | None,
           singleton: bool, webhook: str | None, array: str | None, as_json: bool, url: str,
           token_file: Path) -> None:
    """Queue an experiment's job (or an array of them) on the arbiter's testbed."""
    body: dict[str, Any] = {"experiment": experiment.read_text(), "priority": priority}
    if array is not None:
        body["array"] = array
    if time_limit is not None:
        body["time_limit_s"] = time_limit
    if after is not None:
        body["after"] = after
    if webhook is not None:
        body["webhook"] = webhook
    if singleton:
        body["singleton"] = True
    j = _call(url, token_file, "POST", "/jobs", body)
    if as_json:
        emit(j)
        return
    if "array" in j:
        t = j["tasks"]
        click.echo(f"{j['array']}: {len(t)} tasks queued ({t[0]['job']} .. {t[-1]['job']}; "
                   f"{t[0]['ranks']} ranks, {t[0]['iterations']} iterations each)")
        return
    click.echo(f"{j['job']} queued ({j['ranks']} ranks, {j['iterations']} iterations, "
               f"priority {j['priority']}, time limit {j['time_limit_s']:g} s)")


def _span(s: float) -> str:
    """Seconds as an operator reads them: 42s, 7m, 3h, 2d."""
    s = max(0.0, s)
    return next(f"{s / d:.0f}{u}" for d, u in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))
                if s >= d or u == "s")


@main.command()
@click.option("--user", "users", multiple=True, help="only this user's (repeatable)")
@click.option("--state", "states", multiple=True,
              type=click.Choice(["queued", "running", "finished", "failed", "cancelled",
                                 "timeout", "quarantined"]),
              help="only jobs in this state (repeatable)")
@click.option("--priority", "factors", is_flag=True,
              help="the queued jobs' priority factors: base + age + fair share")
@click.option("--json", "as_json", is_flag=True)
@_client_options
def jobs(users: tuple[str, ...], states: tuple[str, ...], factors: bool, as_json: bool,
         url: str, token_file: Path) -> None:
    """The arbiter's jobs, as Slurm's squeue shows them: priority now, held, time limit,
    time waited (queued) or running, progress, and where each runs or why it waits
    (resources, reservation, nodes out of service, held, approval, dependency, user
    limit) with its expected start where the reservation gives one."""
    from urllib.parse import urlencode

    q = urlencode([("user", u) for u in users] + [("state", s) for s in states])
    js = _call(url, token_file, "GET", "/jobs" + (f"?{q}" if q else ""))["jobs"]
    if as_json:
        emit(js)
        return
    now = time.time()
    if factors:
        click.echo(f"{'job':>5} {'user':<12} {'priority':>9} {'base':>6} {'age':>8} "
                   f"{'share':>8}")
        for j in js:
            if "priority_now" in j:
                click.echo(f"{j['job']:>5} {j['user']:<12} {j['priority_now']:>9.1f} "
                           f"{j['priority']:>6} {j['age']:>8.2f} {j['share']:>8.2f}")
        return
    click.echo(f"{'job':>5} {'user':<10} {'state':<9} {'prio':>6} {'limit':>6} {'time':>6} "
               f"{'done':>6}/{'of':<6} where, or why it waits")
    for j in js:
        limit = _span(j["time_limit_s"]) if j["time_limit_s"] else "-"
        took = _span(now - j["submitted"]) if j["state"] == "queued" else \
            _span((j["ended"] or now) - j["started"]) if j["started"] else "-"
        if j["state"] == "queued":
            where = j.get("reason", "") + (" (held)" if j["held"] and "held" not in
                                            j.get("reason", "held") else "")
            if j.get("expected_start"):
                where += ", starts by " + time.strftime(
                    "%H:%M:%S", time.localtime(j["expected_start"]))
        elif j.get("reason"):  # running, but stopped for a fault (or starting)
            where = j["reason"]
        else:
            where = (j["partition"] or "-") + (f"  {j['why']}" if j["why"] else "")
        prio = f"{j.get('priority_now', j['priority']):.0f}" \
            if j["priority"] is not None else "-"
        click.echo(f"{j['job']:>5} {j['user']:<10} {j['state']:<9} {prio:>6} {limit:>6} "
                   f"{took:>6} {j['iterations_done']:>6}/{j['iterations'] or 0:<6} {where}")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@_client_options
def status(as_json: bool, url: str, token_file: Path) -> None:
    """The testbed as Slurm's sinfo shows it: each node's state (free, held by which job,
    down, drained or closed, and why), the free nodes, the queue's reservation, the jobs
    by state."""
    st = _call(url, token_file, "GET", "/status")
    if as_json:
        emit(st)
        return
    click.echo(f"{st['testbed']}: {st['free_nodes']} of {len(st['nodes'])} nodes free; "
               + ", ".join(f"{k} {v}" for k, v in sorted(st["jobs"].items())))
    for node, d in st["nodes"].items():
        extra = " ".join(x for x in (d.get("job", ""), f"(also {d['also']})"
                                     if "also" in d else "", d.get("why", "")) if x)
        click.echo(f"  {node:<12} {d['state']:<8} {extra}")
    for w in st.get("maintenance", []):
        what = f"reservation for {w['for']}" if w.get("for") else "maintenance"
        click.echo(f"{what} {w['id']}: {', '.join(w['nodes'])} from "
                   + time.strftime("%Y-%m-%d %H:%M", time.localtime(w["start"])) + " to "
                   + time.strftime("%Y-%m-%d %H:%M", time.localtime(w["end"]))
                   + f" ({w['why']}, by {w['by']})")
    if (r := st["reservation"]) is not None:
        click.echo(f"reservation: {r['job']} on {', '.join(r['nodes'])} by "
                   + time.strftime("%H:%M:%S", time.localtime(r["start"])))
    if st["invariant_violations"]:
        click.echo(f"invariant violations: {st['invariant_violations']}")


@main.command()
@click.argument("nodes", nargs=-1, required=True)
@click.option("--reason", required=True, help="why, as `oddl status` shows it")
@_client_options
def drain(nodes: tuple[str, ...], reason: str, url: str, token_file: Path) -> None:
    """An operator drains nodes: no job is placed on them (a job on one runs on to its
    end) until `oddl resume`; kept across restarts of the arbiter."""
    for n in nodes:
        _call(url, token_file, "POST", f"/nodes/{n}/drain", {"reason": reason})
        click.echo(f"{n} drained: {reason}")


@main.command()
@click.argument("nodes", nargs=-1, required=True)
@_client_options
def resume(nodes: tuple[str, ...], url: str, token_file: Path) -> None:
    """An operator puts drained nodes (or nodes a device would not clear) back in
    service."""
    for n in nodes:
        _call(url, token_file, "POST", f"/nodes/{n}/resume")
        click.echo(f"{n} resumed")


@main.command()
@click.argument("action", type=click.Choice(["add", "remove"]))
@click.argument("what", nargs=-1, required=True, metavar="NODE... | ID")
@click.option("--start", type=click.DateTime(), default=None, help="from then (default: now)")
@click.option("--end", type=click.DateTime(), default=None, help="to then (add: required)")
@click.option("--reason", default=None, help="why, as `oddl status` shows it (add: required)")
@click.option("--for", "holder", default="", metavar="user:NAME|role:ROLE",
              help="add: a reservation, the nodes kept for this user's or role's jobs "
                   "(default: maintenance, for no job)")
@_client_options
def maintenance(action: str, what: tuple[str, ...], start: Any, end: Any, reason: str | None,
                holder: str, url: str, token_file: Path) -> None:
    """An operator reserves nodes for maintenance over a window (`add NODE... --end T
    --reason R [--start T]`): no job is placed on them that would still run when it
    begins, and none during it; with `--for user:NAME` (or `role:ROLE`) the window is a
    reservation, the nodes kept for that user's (or role's) jobs alone. `remove ID` takes
    a window back. `oddl status` lists them."""
    if action == "remove":
        for w in what:
            _call(url, token_file, "DELETE", f"/maintenance/{w}")
            click.echo(f"maintenance {w} removed")
        return
    if end is None or reason is None:
        raise click.UsageError("add needs --end and --reason")
    made = _call(url, token_file, "POST", "/maintenance", {
        "nodes": list(what), "start": start.timestamp() if start else time.time(),
        "end": end.timestamp(), "reason": reason} | ({"for": holder} if holder else {}))
    kind = f"reservation for {holder}" if holder else "maintenance"
    click.echo(f"{kind} {made['id']}: {', '.join(made['nodes'])} until "
               + time.strftime("%Y-%m-%d %H:%M", time.localtime(made["end"])))


@main.command()
@click.argument("action", type=click.Choice(["add", "remove"]))
@click.argument("name")
@click.option("--role", type=click.Choice(["user", "operator", "observer"]), default="user",
              show_default=True)
@_client_options
def user(action: str, name: str, role: str, url: str, token_file: Path) -> None:
    """An operator adds a user (their token in the arbiter's STATE/tokens/NAME) or removes
    one (their token goes, their jobs stay), at run time; kept across restarts."""
    if action == "add":
        r = _call(url, token_file, "POST", f"/users/{name}", {"role": role})
        click.echo(f"{name}: {r['role']}, token in {r['token_file']}")
    else:
        _call(url, token_file, "DELETE", f"/users/{name}")
        click.echo(f"{name}: removed")


def _job_command(name: str, method: str, suffix: str, done: str, doc: str) -> None:
    """`oddl NAME JOB`: one request on a job, and what became of it."""

    @main.command(name=name, help=doc)
    @click.argument("job")
    @_client_options
    def command(job: str, url: str, token_file: Path) -> None:
        _call(url, token_file, method, f"/jobs/{job}{suffix}")
        click.echo(f"{job} {done}")


_job_command("cancel", "DELETE", "", "cancelled",
             "Cancel a queued or running job (your own; an operator's: anyone's).")
_job_command("hold", "POST", "/hold", "held",
             "An operator holds a queued job: it starts only once released.")
_job_command("release", "POST", "/release", "released", "An operator releases a held job.")
_job_command("requeue", "POST", "/requeue", "queued again",
             "Put a job back in the queue with its recorded iterations kept: a running one "
             "is stopped first (the iteration it was in runs again), a failed or cancelled "
             "one goes on from its first iteration not recorded (your own; an operator's: "
             "anyone's, and one that ran out of its time limit).")


@main.command()
@click.argument("job")
@click.option("--time-limit", "time_limit", type=_SECONDS, required=True,
              help="seconds from its first start (within the arbiter's max_time_limit_s); "
                   "a running job past it ends now")
@_client_options
def update(job: str, time_limit: float, url: str, token_file: Path) -> None:
    """Change a queued or running job's time limit (your own; an operator's: anyone's)."""
    j = _call(url, token_file, "PUT", f"/jobs/{job}/time_limit", {"time_limit_s": time_limit})
    click.echo(f"{job}: time limit {j['time_limit_s']:g} s")


@main.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
@_client_options
def wait(job: str, as_json: bool, url: str, token_file: Path) -> None:
    """Until the job ends; then its results. Exit 0 if it finished, 1 if not. An arbiter
    that restarts meanwhile is waited for ($ODDL_ARBITER_PATIENCE s)."""
    from oddl.app.ledger import ENDED

    while True:
        j = _call(url, token_file, "GET", f"/jobs/{job}")
        if j["state"] in ENDED:
            break
        time.sleep(0.2)
    if as_json:
        emit(j)
    else:
        r = j["result"] or {}
        click.echo(f"{job} {j['state']}{': ' + j['why'] if j['why'] else ''}; "
                   f"{j['iterations_done']}/{j['iterations']} iterations"
                   + (f", JCT {r['jct_s']:.3f} s" if r.get("jct_s") is not None else "")
                   + (f" ({r['arbiter_down_s']:.1f} s of it with no arbiter)"
                      if r.get("arbiter_down_s") else ""))
    sys.exit(0 if j["state"] == "finished" else 1)


@main.command()
@click.argument("job")
@_client_options
def logs(job: str, url: str, token_file: Path) -> None:
    """A job's log, with full timestamps: queued, where it ran, each stop, each restart of
    the arbiter, its end (your own; an operator's: anyone's)."""
    click.echo("\n".join(_call(url, token_file, "GET", f"/jobs/{job}/logs")["log"]))


@main.command()
@click.argument("job")
@click.argument("value", type=click.IntRange(-1000, 1000))
@_client_options
def priority(job: str, value: int, url: str, token_file: Path) -> None:
    """An operator gives a queued job a new priority (the queue: by priority, then
    arrival)."""
    _call(url, token_file, "PUT", f"/jobs/{job}/priority", {"priority": value})
    click.echo(f"{job} priority {value}")


@main.command()
@click.option("--since", type=click.DateTime(), default=None,
              help="from then (default: the beginning)")
@click.option("--until", type=click.DateTime(), default=None, help="to then (default: now)")
@click.option("--per-job", is_flag=True, help="a line per job")
@click.option("--csv", "as_csv", is_flag=True, help="CSV: user, job, state, node_hours")
@click.option("--json", "as_json", is_flag=True)
@_client_options
def usage(since: Any, until: Any, per_job: bool, as_csv: bool, as_json: bool, url: str,
          token_file: Path) -> None:
    """Accounting per user (and per job): node-hours for the time jobs held nodes within
    the window (not their time queued, nor time no arbiter ran), jobs by state, wait
    times (a user sees their own)."""
    try:  # (year 1 is no Unix time: ValueError, or OverflowError, from the C library)
        t = since.timestamp() if since is not None else 0
        end = until.timestamp() if until is not None else None
    except (ValueError, OverflowError, OSError) as e:
        raise click.BadParameter(f"not a time this machine can count from 1970: {e}",
                                 param_hint="--since/--until") from None
    q = f"/usage?since={t}" + (f"&until={end}" if end is not None else "")
    u = _call(url, token_file, "GET", q)["users"]
    if as_json:
        emit(u)
        return
    if as_csv or per_job:
        import csv

        if as_csv:
            w = csv.writer(sys.stdout)
            w.writerow(["user", "job", "state", "node_hours"])
        for name, x in sorted(u.items()):
            for job, jx in x["per_job"].items():
                if as_csv:
                    w.writerow([name, job, jx["state"], jx["node_hours"]])
                else:
                    click.echo(f"{name:<12} {job:>6} {jx['state']:<10} "
                               f"{jx['node_hours']:>10.4f}")
        return
    click.echo(f"{'user':<12} {'jobs':>5} {'node-h':>9} {'wait mean':>10} {'wait max':>9}  "
               f"states")
    for name, x in sorted(u.items()):
        mean = f"{x['wait_mean_s']:.1f} s" if x["wait_mean_s"] is not None else "-"
        most = f"{x['wait_max_s']:.1f} s" if x["wait_max_s"] is not None else "-"
        states = ", ".join(f"{k} {v}" for k, v in sorted(x["states"].items()))
        click.echo(f"{name:<12} {x['jobs']:>5} {x['node_hours']:>9.3f} {mean:>10} "
                   f"{most:>9}  {states}")


@main.command()
@click.argument("user")
@click.option("--revoke", is_flag=True, help="delete it: the user has no token until rotated")
@_client_options
def token(user: str, revoke: bool, url: str, token_file: Path) -> None:
    """An operator rotates a user's token (a new one in their token file on the arbiter's
    host; the old one is refused at once) or revokes it."""
    r = _call(url, token_file, "DELETE" if revoke else "POST", f"/tokens/{user}")
    click.echo(f"{user}: token revoked" if revoke else
               f"{user}: a new token in {r['token_file']}")
