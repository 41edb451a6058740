"""Issue 9 item 27 on Prometheus itself: a canary's samples from before its switch do not count.

One canary node, 1-minute samples 0m..20m. Until 8m it runs iptables and every sync is
slow (100 a minute in the 2.048 s bucket); at 8m it switches to nftables and every sync is
fast (100 a minute at or below 0.016 s). The round runs at 10m with a 300 s window:
rendered over the whole window the canary's p99 is the iptables one (> 1 s, the check
fails the healthy migration); over the window the adapter clips to the switch
(``clipped_window``, 120 s here) it is the nftables one (< 1 s).
"""

from __future__ import annotations

from pathlib import Path

from proxymode.analysis.templates import clipped_window, group_query
from proxymode.api.models import Check
from tests.promql.test_templates_promtool import SYNC, SYNC_LE, _kube_proxy, _passed, _run, _series

NODE = "canary-1.pool-a.example"
WINDOW = 300
SWITCH_MINUTE = 8
EVAL_MINUTE = 10
CHECK = Check.model_validate({"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1})


def _bucket(le: float) -> str:
    """A bucket's cumulative counter: slow syncs count from 2.048 s up, fast ones from 16 ms."""
    if le >= 2.048:
        return "0+100x20"  # slow before the switch, fast after: every sync is at or below
    if le >= 0.016:
        return f"0x{SWITCH_MINUTE} 100+100x{19 - SWITCH_MINUTE}"  # only the fast ones
    return "0x20"


def _series_for_one_canary() -> list[dict[str, str]]:
    labels = _kube_proxy(NODE)
    out = [_series(f"{SYNC}_bucket", {**labels, "le": f"{le:g}"}, _bucket(le)) for le in SYNC_LE]
    out.append(_series(f"{SYNC}_bucket", {**labels, "le": "+Inf"}, "0+100x20"))
    return out


def _over_limit(window_seconds: int) -> dict[str, object]:
    """1 when the canary's p99 over ``window_seconds`` breaks ``maxSeconds: 1``, else 0."""
    query = group_query(CHECK, nodes=[NODE], node_label="instance", window_seconds=window_seconds)
    return {"expr": f"({query}) > bool 1", "eval_time": f"{EVAL_MINUTE}m"}


def test_the_clipped_window_starts_at_the_switch() -> None:
    since = (EVAL_MINUTE - SWITCH_MINUTE) * 60.0
    assert clipped_window(WINDOW, since) == 120
    assert clipped_window(WINDOW, 1000.0) == WINDOW
    assert clipped_window(WINDOW, None) == WINDOW
    assert clipped_window(WINDOW, 0.4) == 1  # too young: the engine does not count it


def test_pre_switch_samples_fail_the_whole_window(tmp_path: Path) -> None:
    """The bug: the 300 s window still holds the iptables-era syncs."""
    case = {**_over_limit(WINDOW), "exp_samples": [{"labels": "{}", "value": 1}]}
    output = _run(tmp_path, _series_for_one_canary(), [case])
    assert _passed(output), output


def test_the_clipped_window_counts_only_the_new_proxys_samples(tmp_path: Path) -> None:
    window = clipped_window(WINDOW, (EVAL_MINUTE - SWITCH_MINUTE) * 60.0)
    case = {**_over_limit(window), "exp_samples": [{"labels": "{}", "value": 0}]}
    output = _run(tmp_path, _series_for_one_canary(), [case])
    assert _passed(output), output
