"""An ODDL network run by the testbed's arbiter: `oddl run --backend hw` on a testbed that
`oddl arbiter` serves submits the experiment's job to it (as the user the token names),
waits for it, records its iterations as they come, and makes its figures the network's
result, as the runner's own would be. The baselines still run here: they are models in
every back end."""

from __future__ import annotations

import functools
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from oddl.app.experiments.results import RunStore
from oddl.app.ledger import ENDED
from oddl.controller.base.access import read_secret
from oddl.controller.service.backend import RunFailed

log = logging.getLogger(__name__)
POLL_S = 0.2
PATIENCE_S = 120.0  # how long a client waits for an arbiter that is down (default)


def patience_s() -> float:
    """How long a client retries an arbiter that does not answer: $ODDL_ARBITER_PATIENCE
    seconds, else PATIENCE_S (an arbiter restarted by systemd is back in seconds)."""
    try:
        return max(0.0, float(os.environ.get("ODDL_ARBITER_PATIENCE", PATIENCE_S)))
    except ValueError:
        return PATIENCE_S


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's own TLS context (its CA store, or $SSL_CERT_FILE's), made once a process:
    httpx makes one for every client, 60 ms of CPU each, and `oddl wait` polling every
    0.2 s spent a third of a core on it."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class ArbiterClient:
    url: str
    token_file: Path
    patience_s: float = field(default_factory=patience_s)

    @functools.cached_property
    def _pool(self) -> httpx.Client:
        """Reads, on connections kept open between polls."""
        return httpx.Client(verify=_tls(), timeout=30)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None
             ) -> dict[str, Any]:
        """One request as the token's user; RunFailed with the service's reason if it is
        refused, or if the arbiter does not answer for `patience_s` (retried meanwhile,
        with backoff: an arbiter restarting is waited for). A request that changes
        something is retried only when it never reached the arbiter."""
        try:
            token = read_secret(self.token_file)
        except OSError as e:
            raise RunFailed(f"{self.token_file}: {e}") from None
        safe = method == "GET"
        # a change goes on a connection of its own: on a kept one that the arbiter had
        # closed meanwhile, whether it was made would be unknown
        send = self._pool.request if safe else functools.partial(httpx.request, verify=_tls(),
                                                                  timeout=30)
        t_end, pause, said = time.monotonic() + self.patience_s, 0.25, False
        while True:
            try:
                r = send(method, self.url.rstrip("/") + path, json=body,
                         headers={"Authorization": f"Bearer {token}"})
                if r.status_code < 500 or not safe:  # a 5xx retried only when harmless
                    break
                why: Exception = RuntimeError(f"{r.status_code}")
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                why = e
            except httpx.TransportError as e:  # it may have reached the arbiter
                if not safe:
                    raise RunFailed(f"arbiter {self.url}: {e} (the request may have been "
                                    f"made: `oddl jobs` says)") from None
                why = e
            if time.monotonic() + pause > t_end:
                raise RunFailed(f"arbiter {self.url}: {why} (retried for "
                                f"{self.patience_s:g} s, ODDL_ARBITER_PATIENCE)") from None
            if not said:
                log.warning("arbiter %s: %s; retrying for up to %g s", self.url, why,
                            self.patience_s)
                said = True
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
        if r.status_code >= 400:
            try:
                reason = r.json().get("error", r.text)
            except ValueError:
                reason = r.text
            raise RunFailed(f"arbiter {self.url}: {r.status_code}: {reason}")
        out: dict[str, Any] = r.json()
        return out

    def run(self, experiment: Path, network: str, compute_ns: int, store: RunStore | None,
            progress: Callable[[str, int, int], None] | None
            ) -> tuple[dict[str, Any], list[list[int]]]:
        """Submit the experiment's job, follow it to its end: (the job, its iterations as
        [i, t_start_ns, t_end_ns]); RunFailed if it did not finish."""
        job = self.call("POST", "/jobs", {"experiment": experiment.read_text()})
        jid, its = job["job"], list[list[int]]()
        while True:
            job = self.call("GET", f"/jobs/{jid}")
            new = self.call("GET", f"/jobs/{jid}/iterations?since={len(its)}")["iterations"]
            for i, t0, t1 in new:
                if store is not None:
                    store.add_iteration(network, i, t0, t1, compute_ns, 0, [])
            its += new
            if progress is not None and new:
                progress(network, len(its), job["iterations"])
            if job["state"] in ENDED and \
                    len(its) >= job["iterations_done"]:
                break
            time.sleep(POLL_S)
        if job["state"] != "finished":
            raise RunFailed(f"arbiter job {jid}: {job['state']}: {job['why']}")
        if store is not None:
            self._flows(jid, network, store)
        return job, its

    def _flows(self, jid: str, network: str, store: RunStore) -> None:
        """The job's flows, as the arbiter's run directory holds them, into the run's store."""
        after = 0
        while True:
            page = self.call("GET", f"/jobs/{jid}/flows?after={after}")
            rows = page["flows"]
            if rows:
                store.add_flows(network, [tuple(r[1:]) for r in rows])
                after = rows[-1][0]
            if not page["more"]:
                return
