"""The report (pure): one self-contained file, charts drawn, opened in headless Chromium."""

from __future__ import annotations

import base64
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxymode.cli import document
from tests.cli.browser import EXTERNAL, check_charts, chromium

START = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
T0 = START.timestamp()


def iso(seconds: float) -> str:
    return (START + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def run_data() -> document.RunData:
    history = [
        ("Preflight", None, 0),
        ("Progressing", "canary", 2),
        ("Analyzing", "canary", 30),
        ("Progressing", "all", 60),
        ("Analyzing", "all", 100),
        ("Completed", "all", 130),
    ]
    policy: dict[str, Any] = {
        "metadata": {"name": "to-nft", "creationTimestamp": iso(0)},
        "spec": {
            "targetMode": "nftables",
            "analysis": {
                "checks": [
                    {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
                    {"name": "conntrack", "template": "ConntrackUsage", "maxRatio": 0.85},
                ]
            },
        },
        "status": {
            "phase": "Completed",
            "sourceMode": "iptables",
            "targetMode": "nftables",
            "startedTime": iso(0),
            "completedTime": iso(130),
            "history": [
                {"time": iso(t), "phase": p, "stage": s, "reason": p, "message": f"<{p}>"}
                for p, s, t in history
            ],
            "baseline": {
                "kubernetesVersion": "v1.37.2",
                "kernels": [{"value": "6.1.0", "count": 5}, {"value": "4.18.0", "count": 1}],
            },
            "preflight": {
                "passed": True,
                "findings": [
                    {
                        "severity": "Warning",
                        "code": "KernelTooOld",
                        "message": "old",
                        "nodes": ["legacy-1"],
                    }
                ],
            },
            "stages": [{"name": "canary", "phase": "Completed", "nodes": ["a", "b"]}],
            "analysis": {
                "checks": [
                    {
                        "name": "sync-p99",
                        "canary": 0.19106246759624274,
                        "baseline": 0.25,
                        "verdict": "Pass",
                    }
                ]
            },
        },
    }
    modes = {
        node: [
            (T0 + t, "iptables" if t < switch else ("switching" if t < switch + 6 else "nftables"))
            for t in range(0, 131, 2)
        ]
        for node, switch in (
            ("canary-1", 4),
            ("canary-2", 14),
            ("general-1", 62),
            ("general-2", 80),
        )
    }
    series = {
        "sync-p99": {
            "canary": [(T0 + t, 0.03 + 0.01 * math.sin(t / 7)) for t in range(30, 131, 5)],
            "baseline": [(T0 + t, 0.12 + 0.02 * math.cos(t / 9)) for t in range(30, 131, 5)],
        },
        "conntrack": {"canary": [(T0 + t, 0.09) for t in range(30, 131, 5)]},
    }
    return document.RunData(
        policy=policy,
        events=[
            {
                "type": "Normal",
                "reason": "StageStarted",
                "message": "<b>x</b>",
                "lastTimestamp": iso(2),
            }
        ],
        now=START + timedelta(seconds=200),
        node_modes=modes,
        check_series=series,
        prometheus_note="series from a test.",
    )


def test_html_is_self_contained_with_every_chart() -> None:
    text = document.to_html(run_data())
    assert EXTERNAL.search(text) is None, EXTERNAL.search(text)
    assert "<script" not in text.lower()
    assert [m for m in re.findall(r'id="chart-([\w-]+)"', text)] == [
        "phases",
        "nodes",
        "checks",
        "kernels",
    ]
    assert text.count("<svg") == 4
    assert "<!DOCTYPE svg" not in text and "<metadata>" not in text
    # What came from the cluster is escaped.
    assert "&lt;b&gt;x&lt;/b&gt;" in text and "<b>x</b>" not in text


def test_phase_spans_follow_the_history() -> None:
    spans = document.phase_spans(run_data())
    assert [s[2] for s in spans] == [
        "Preflight",
        "Progressing",
        "Analyzing",
        "Progressing",
        "Analyzing",
        "Completed",
    ]
    assert spans[0][:2] == (T0, T0 + 2)
    assert spans[-1][1] > T0 + 130, "the terminal phase is drawn, not a zero-width bar"


def test_nodes_handed_back_at_finalizing_show_the_target_mode() -> None:
    base = run_data()
    history = [
        *base.status["history"][:-1],
        {"time": iso(110), "phase": "Finalizing", "reason": "Finalizing"},
        base.status["history"][-1],
    ]
    status = {**base.status, "history": history, "finalized": True}
    modes = {"canary-1": [(T0 + 100, "nftables"), (T0 + 112, "iptables"), (T0 + 120, "iptables")]}
    data = document.RunData(
        policy={**base.policy, "status": status}, events=[], now=base.now, node_modes=modes
    )
    assert [m for _, m in document.node_mode_samples(data)["canary-1"]] == ["nftables"] * 3
    kept = document.RunData(
        policy={**base.policy, "status": {**status, "finalized": False}},
        events=[],
        now=base.now,
        node_modes=modes,
    )
    assert [m for _, m in document.node_mode_samples(kept)["canary-1"]][1] == "iptables"


def test_markdown_embeds_the_charts_as_data_images() -> None:
    text = document.to_markdown(run_data())
    images = re.findall(r"\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", text)
    assert len(images) == 4
    assert all(base64.b64decode(i).startswith(b"<svg") for i in images)
    assert EXTERNAL.search(text) is None
    assert "| KernelTooOld |" in text.replace("| Warning ", "")
    # Measured values as a person reads them, not every digit of a float.
    assert "| sync-p99 | 0.1911 | 0.25 |" in text and "0.19106" not in text


@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium")
def test_the_charts_are_drawn_in_chromium(tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    html.write_text(document.to_html(run_data()))
    png, charts = check_charts(html, tmp_path)
    assert png.stat().st_size > 10_000
    assert [c.ident for c in charts] == ["phases", "nodes", "checks", "kernels"]
    for c in charts:
        assert c.box is not None, f"chart {c.ident} draws nothing"
        width, height = c.box[2] - c.box[0], c.box[3] - c.box[1]
        assert width > 400 and height > 60, (c.ident, c.box)
        assert c.changed > 3000, (c.ident, c.changed)
        assert c.stddev > 20 and c.colours > 8, c
