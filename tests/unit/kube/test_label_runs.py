"""Which of a batch's actions the executor sends side by side (``label_run``, pure)."""

from __future__ import annotations

from proxymode.engine.actions import ClearAction, SetNodeMode
from proxymode.kube.execute import label_run


def test_consecutive_changes_on_distinct_nodes_form_one_run() -> None:
    batch = [SetNodeMode(n, "switching", None) for n in ("a", "b", "c")]
    assert label_run(batch, 0) == batch
    assert label_run(batch, 1) == batch[1:]


def test_a_second_change_of_one_node_ends_the_run() -> None:
    first, second = SetNodeMode("a", "switching", None), SetNodeMode("b", "switching", None)
    again = SetNodeMode("a", "nftables", "switching")
    batch = [first, second, again]
    assert label_run(batch, 0) == [first, second]
    assert label_run(batch, 2) == [again]


def test_any_other_action_ends_the_run_and_starts_none() -> None:
    change = SetNodeMode("a", "switching", None)
    batch = [change, ClearAction("abort"), SetNodeMode("b", "switching", None)]
    assert label_run(batch, 0) == [change]
    assert label_run(batch, 1) == []
    assert label_run(batch, 2) == [batch[2]]
