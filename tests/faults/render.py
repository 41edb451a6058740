"""Print the figures table of docs/reliability.md from the JSON the matrix writes.

PROXYMODE_FAULT_REPORT=/tmp/faults.json pytest tests/faults
python -m tests.faults.render /tmp/faults.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _faults(case: dict[str, Any]) -> str:
    parts = []
    for f in case["faults"]:
        where = f.get("phase", "")
        if f.get("moves"):
            where += f" (moving {', '.join(f['moves'])})"
        took = f" {f['seconds']}s" if "seconds" in f else ""
        parts.append(f"{f['fault']}{took} in {where}")
    return "; ".join(parts)


def render(data: dict[str, Any]) -> str:
    lines = [
        "| round | case | fault | injected | outcome | samples | violations | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rnd in data.items():
        for case in rnd["cases"]:
            outcome = case["outcome"] or "did not end"
            if case["error"]:
                outcome += f" ({case['error'].splitlines()[0][:90]})"
            lines.append(
                f"| {name} | {case['name']} | {case['fault']} | {_faults(case)} | {outcome}"
                f" | {case['samples']} | {len(case['violations'])} | {case['seconds']:.0f} |"
            )
    lines.append("")
    for name, rnd in data.items():
        extra = f", {rnd['kills']} operator kills ({rnd['killsByPhase']})" if "kills" in rnd else ""
        lines.append(
            f"- {name} (finished {rnd['finished']}): {rnd['seconds']:.0f}s, {rnd['samples']}"
            f" samples, {rnd['missed']} missed while the API was down, {rnd['violations']}"
            f" violations, {rnd['samplerErrors']} sampler errors{extra}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(json.loads(Path(sys.argv[1]).read_text())))
