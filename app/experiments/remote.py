"""An ODDL network run by the testbed's arbiter: `oddl run --backend hw` on a testbed that
`oddl arbiter` serves submits the experiment's job to it (as the user the token names),
waits for it, records its iterations as they come, and makes its figures the network's
result, as the runner's own would be. The baselines still run here: they are models in
every back end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from oddl.app.experiments.results import RunStore
from oddl.controller.base.access import read_secret
from oddl.controller.service.backend import RunFailed

POLL_S = 0.2


@dataclass(frozen=True)
class ArbiterClient:
    url: str
    token_file: Path

    def call(self, method: str, path: str, body: dict[str, Any] | None = None
             ) -> dict[str, Any]:
        """One request as the token's user; RunFailed with the service's reason if it
        cannot be made or is refused."""
        try:
            token = read_secret(self.token_file)
            r = httpx.request(method, self.url.rstrip("/") + path, json=body, timeout=30,
                              headers={"Authorization": f"Bearer {token}"})
        except (OSError, httpx.HTTPError) as e:
            raise RunFailed(f"arbiter {self.url}: {e}") from None
        if r.status_code >= 400:
            try:
                why = r.json().get("error", r.text)
            except ValueError:
                why = r.text
            raise RunFailed(f"arbiter {self.url}: {r.status_code}: {why}")
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
            if job["state"] in ("finished", "failed", "cancelled") and \
                    len(its) >= job["iterations_done"]:
                break
            time.sleep(POLL_S)
        if job["state"] != "finished":
            raise RunFailed(f"arbiter job {jid}: {job['state']}: {job['why']}")
        return job, its
