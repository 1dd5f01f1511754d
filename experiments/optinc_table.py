"""docs/optinc.md's training table, from runs: `oddl optinc train --servers N --json` at 4,
8 and 16 servers, printed as markdown; `--write` puts it into docs/optinc.md between its
markers (`<!-- optinc-train -->` ... `<!-- /optinc-train -->`), with the machine it ran on.

    python experiments/optinc_table.py [--write]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

DOC = Path(__file__).resolve().parent.parent / "docs" / "optinc.md"
BEGIN, END = "<!-- optinc-train -->", "<!-- /optinc-train -->"
SIZES = {4: "4", 8: "8", 16: "16 (4 × 4 cascade)"}


def run(servers: int) -> dict[str, float]:
    r = subprocess.run([sys.executable, "-m", "oddl.app", "optinc", "train", "--servers",
                        str(servers), "--json"], capture_output=True, text=True, check=True)
    out: dict[str, float] = json.loads(r.stdout)
    return out


def machine() -> str:
    """The CPU and the kernels numpy picked: what the optical column depends on."""
    from numpy.core._multiarray_umath import __cpu_features__ as f  # type: ignore[import]

    simd = "AVX-512" if f.get("AVX512F") else "AVX2" if f.get("AVX2") else "SSE"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, numpy {np.__version__} with {simd}"


def table() -> str:
    rows = ["| servers | exact | OptINC (default chip) | replicas apart |",
            "|---|---|---|---|"]
    for n, label in SIZES.items():
        d = run(n)
        rows.append(f"| {label} | {d['exact_accuracy']:.4f} | {d['optical_accuracy']:.4f} | "
                    f"{d['replica_drift']:.4f} |")
    return "\n".join(rows) + f"\n\n(`python experiments/optinc_table.py --write`, on {machine()}.)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="into docs/optinc.md")
    args = ap.parse_args()
    t = table()
    print(t)
    if args.write:
        text = DOC.read_text()
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{t}\n{END}{tail}")


if __name__ == "__main__":
    main()
