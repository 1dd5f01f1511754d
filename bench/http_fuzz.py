"""Hostile HTTP against a live `oddl arbiter` (issue 85): generated requests on every route
the arbiter serves, as an operator, a user, an observer and a stranger: mutated paths and
path parameters (huge integers, dots, percent escapes, long names), methods, query strings
and bodies (mutated submissions and operator requests). Prints the statuses it got, the
5xx answers (each one a defect), the requests that took over 10 s, and whether the arbiter
still answers and still runs a job afterwards.

    python bench/http_fuzz.py [--n 10000] [--seed 0]

It starts an emulated 2 x 2 grid and an arbiter of its own on 127.0.0.1 (a minute or two
on 2 cores at 10,000 requests).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.fuzz_targets import mutate
from tests.helpers import emulated_grid
from tests.test_arbiter import JOB, Arbiter

ROOT = Path(__file__).resolve().parent.parent
SLOW_S = 10.0
ROUTES = [("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/jobs/{job}"),
          ("DELETE", "/jobs/{job}"), ("POST", "/jobs/{job}/hold"),
          ("POST", "/jobs/{job}/release"), ("PUT", "/jobs/{job}/priority"),
          ("GET", "/jobs/{job}/logs"), ("GET", "/jobs/{job}/iterations"),
          ("GET", "/jobs/{job}/flows"), ("GET", "/usage"), ("POST", "/tokens/{user}"),
          ("DELETE", "/tokens/{user}"), ("GET", "/status"), ("POST", "/nodes/{node}/drain"),
          ("POST", "/nodes/{node}/resume"), ("POST", "/users/{user}"),
          ("DELETE", "/users/{user}"), ("POST", "/maintenance"),
          ("DELETE", "/maintenance/{window}")]
PARAMS = ["1", "0", "-1", "9223372036854775808", "1e309", "nan", "..", "%2e%2e", "%00",
          "a" * 5000, "n0-0", "bob", "j\u00e9", "%ff%fe", "1.5", " ", "ø" * 300]
QUERIES = ["", "?since=0", "?since=-1", "?since=1e400", "?limit=99999999999", "?limit=-5",
           "?state=queued", "?user=%00", "?from=9223372036854775808&limit=1", "?x=" + "y" * 9000]
BODIES = [JOB.format(name="f", iterations=2, ranks=2).encode(),
          b'{"priority": 5}', b'{"reason": "fuzz"}', b'{"role": "user"}',
          b'{"nodes": ["n0-0"], "start": 0, "end": 60, "reason": "m"}', b"{}", b"[]", b""]


def request(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    method, path = rng.choice(ROUTES)
    if rng.random() < 0.1:
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
    path = path.format(job=rng.choice([*PARAMS, "f-1"]), user=rng.choice(PARAMS),
                       node=rng.choice(PARAMS), window=rng.choice(PARAMS))
    body = rng.choice(BODIES) if method in ("POST", "PUT") else b""
    if body and rng.random() < 0.7:
        body = mutate(body, rng, 6)
    if method == "POST" and path == "/jobs" and rng.random() < 0.5:  # as the client sends it
        body = json.dumps({"experiment": body.decode("utf-8", "replace")}).encode()
    return method, path + rng.choice(QUERIES), body, {"Content-Type": rng.choice(
        ["application/json", "text/plain", "application/x-www-form-urlencoded"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    d = Path(tempfile.mkdtemp(prefix="oddl-http-fuzz-"))
    statuses: collections.Counter[int] = collections.Counter()
    errors: list[str] = []
    slow = 0
    with emulated_grid(ROOT, d, limit_s=3600) as emu:
        arb = Arbiter(ROOT, emu, d / "state", 0)
        try:
            # (bob is the one user the requests may delete or give a new token)
            tokens = {u: arb.token(u) for u in ("ops", "alice", "eve")}
            users = [None, *tokens]
            t0 = time.perf_counter()
            for _ in range(args.n):
                method, path, body, headers = request(rng)
                who = rng.choice(users)
                if who is not None:
                    headers["Authorization"] = f"Bearer {tokens[who]}"
                t = time.perf_counter()
                try:
                    r = arb.http.request(method, arb.url + path, content=body,
                                         headers=headers, timeout=SLOW_S)
                    statuses[r.status_code] += 1
                    if r.status_code >= 500 and len(errors) < 10:
                        errors.append(f"{r.status_code} {method} {path[:80]}: {r.text[:200]}")
                except httpx.TimeoutException:
                    slow += 1
                slow += time.perf_counter() - t > SLOW_S
            took = time.perf_counter() - t0
            alive = arb.call("ops", "GET", "/status").status_code
            job = arb.submit("alice", "after", 2)
            end = time.monotonic() + 120
            while (state := arb.call("alice", "GET", f"/jobs/{job}").json()["state"]) \
                    not in ("finished", "failed", "cancelled") and time.monotonic() < end:
                time.sleep(0.2)
        finally:
            arb.stop()
    fives = sum(n for s, n in statuses.items() if s >= 500)
    print(f"{args.n} requests in {took:.0f} s; statuses: "
          + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())))
    for e in errors:
        print("  " + e)
    print(f"5xx: {fives}; over {SLOW_S:g} s: {slow}; afterwards /status {alive}, a job "
          f"{state}")
    if fives or slow or alive != 200 or state != "finished":
        sys.exit(1)


if __name__ == "__main__":
    main()
