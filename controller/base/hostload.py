"""How loaded this host is now, said beside a verdict a late answer can produce.

A verdict that a late answer produces (a board silent, a flow with no GRANT, a round trip
over its limit) may be the host's doing: its CPU shared by more runnable work than it has
cores. Linux's pressure stall information (`/proc/pressure/cpu`, "some": the share of the
last 10 s in which some runnable task waited for a CPU) says so directly; the load average
against the cores says it anywhere else. Read only when a verdict is said, never to make
one: the figures are the moment's, and a model run (virtual time) never reads them.
"""

from __future__ import annotations

import os
from pathlib import Path

PSI_CPU = Path("/proc/pressure/cpu")
# a host's loop running this late is loaded, not noise (timer jitter is well under it)
LAG_FLOOR_NS = 1_000_000
LOADED_PRESSURE = 50.0  # % of the last 10 s some runnable task waited for a CPU
LOADED_PER_CORE = 1.5  # runnable tasks a core (the 1-minute load average)


def cpu_pressure(path: Path = PSI_CPU) -> float | None:
    """The share (%) of the last 10 s some runnable task on this host waited for a CPU;
    None where the kernel does not say (not Linux, or PSI off)."""
    try:
        head = path.read_text()[:256].split("\n", 1)[0].split()
        fields = dict(f.split("=", 1) for f in head[1:] if "=" in f)
        return float(fields["avg10"]) if head and head[0] == "some" else None
    except (OSError, KeyError, ValueError):
        return None


def host_load(path: Path = PSI_CPU) -> str:
    """This host's CPU now, in words, if it is loaded ("" if not, or if nothing says)."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    pressure = cpu_pressure(path)
    if (pressure is None or pressure < LOADED_PRESSURE) and load < LOADED_PER_CORE * cores:
        return ""
    said = f"this host's load {load:.1f} on {cores} core{'s' * (cores > 1)}"
    if pressure is not None:
        said += f", tasks waiting for a CPU {pressure:.0f}% of the last 10 s"
    return said
