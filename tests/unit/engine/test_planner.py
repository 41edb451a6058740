"""The planner: cumulative percents, selectors, zone spread, caps, stability."""

from __future__ import annotations

import pytest

from proxymode.api.models import LabelSelector, PolicySpec, Stage
from proxymode.engine.planner import (
    PlanNode,
    max_unavailable_count,
    plan_hash,
    plan_stages,
    selector_matches,
    zone_spread,
)

ZONES = ("a", "b", "c")


def cluster(canary: int = 2, general: int = 10) -> list[PlanNode]:
    nodes = [PlanNode(f"canary-{i}", {"pool": "canary"}, ZONES[i % 3]) for i in range(canary)]
    nodes += [
        PlanNode(f"general-{i:02d}", {"pool": "general"}, ZONES[i % 3]) for i in range(general)
    ]
    return nodes


def stage(name: str, **kw: object) -> Stage:
    return Stage.model_validate({"name": name, **kw})


CANARY = stage("canary", nodeSelector={"matchLabels": {"pool": "canary"}})


def test_selector_semantics() -> None:
    labels = {"pool": "canary", "zone": "a"}
    assert selector_matches(None, labels)
    assert selector_matches(LabelSelector(), labels)
    assert selector_matches(LabelSelector(match_labels={"pool": "canary"}), labels)
    assert not selector_matches(LabelSelector(match_labels={"pool": "general"}), labels)
    expr = LabelSelector.model_validate(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    )
    assert selector_matches(expr, labels) and not selector_matches(expr, {"zone": "c"})
    not_in = LabelSelector.model_validate(
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}
    )
    assert not selector_matches(not_in, labels) and selector_matches(not_in, {})
    exists = LabelSelector.model_validate(
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    )
    assert not selector_matches(exists, labels) and selector_matches(exists, {"gpu": ""})
    absent = LabelSelector.model_validate(
        {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}
    )
    assert selector_matches(absent, labels) and not selector_matches(absent, {"gpu": "x"})


def test_zone_spread_interleaves_zones_deterministically() -> None:
    nodes = [
        PlanNode("n1", zone="b"),
        PlanNode("n2", zone="a"),
        PlanNode("n3", zone="a"),
        PlanNode("n4", zone="c"),
        PlanNode("n5", zone="b"),
    ]
    order = [n.name for n in zone_spread(nodes)]
    assert order == ["n2", "n1", "n4", "n3", "n5"]
    assert [n.name for n in zone_spread(list(reversed(nodes)))] == order


def test_canary_then_cumulative_percents() -> None:
    nodes = cluster(canary=2, general=10)  # 12 eligible
    plan = plan_stages([CANARY, stage("tenth", percent=25), stage("all", percent=100)], nodes)
    assert sorted(plan[0]) == ["canary-0", "canary-1"]
    assert len(plan[1]) == 1  # ceil(25% of 12) = 3 in all, 2 already planned
    assert len(plan[2]) == 9
    flat = [n for s in plan for n in s]
    assert sorted(flat) == sorted(n.name for n in nodes) and len(set(flat)) == len(flat)


def test_a_percent_stage_spreads_across_zones() -> None:
    nodes = cluster(canary=0, general=9)
    plan = plan_stages([stage("third", percent=34)], nodes)
    zones = {n.zone for n in nodes if n.name in plan[0]}
    assert len(plan[0]) == 4 and zones == {"a", "b", "c"}


def test_max_nodes_caps_a_stage() -> None:
    nodes = cluster(canary=5, general=3)
    capped = stage("canary", nodeSelector={"matchLabels": {"pool": "canary"}}, maxNodes=3)
    plan = plan_stages([capped, stage("all", percent=100)], nodes)
    assert len(plan[0]) == 3 and len(plan[1]) == 5


def test_selector_and_percent_fill_from_matching_nodes_only() -> None:
    nodes = cluster(canary=2, general=10)
    s = stage("gen-half", nodeSelector={"matchLabels": {"pool": "general"}}, percent=50)
    plan = plan_stages([s], nodes)
    assert len(plan[0]) == 6 and all(n.startswith("general-") for n in plan[0])


def test_stages_that_cover_only_some_pools_leave_the_rest() -> None:
    nodes = cluster(canary=2, general=4)
    plan = plan_stages([CANARY], nodes)
    assert sorted(plan[0]) == ["canary-0", "canary-1"]


def test_started_stages_keep_their_nodes_and_count_towards_percents() -> None:
    nodes = cluster(canary=2, general=10)
    stages = [CANARY, stage("half", percent=50), stage("all", percent=100)]
    first = plan_stages(stages, nodes)
    # canary-1 was deleted; a new canary node joined after the canary stage started.
    later_nodes = [n for n in nodes if n.name != "canary-1"] + [
        PlanNode("canary-9", {"pool": "canary"})
    ]
    again = plan_stages(stages, later_nodes, fixed={0: first[0]})
    assert again[0] == [n for n in first[0] if n != "canary-1"]
    assert "canary-9" in again[1] + again[2], "the newcomer is planned in a later stage"
    assert len(again[0]) + len(again[1]) == 6  # ceil(50% of 12)


@pytest.mark.parametrize(
    ("value", "total", "want"),
    [(1, 10, 1), (3, 10, 3), ("10%", 10, 1), ("25%", 10, 3), ("1%", 3, 1), ("100%", 7, 7)],
)
def test_max_unavailable_count(value: int | str, total: int, want: int) -> None:
    assert max_unavailable_count(value, total) == want


def test_plan_hash_ignores_bake_times_but_not_stages() -> None:
    base = {
        "targetMode": "nftables",
        "stages": [{"name": "canary", "percent": 10, "bakeSeconds": 60}],
    }
    h = plan_hash(PolicySpec.model_validate(base))
    slower = {**base, "stages": [{"name": "canary", "percent": 10, "bakeSeconds": 600}]}
    wider = {**base, "stages": [{"name": "canary", "percent": 20, "bakeSeconds": 60}]}
    ipvs = {**base, "targetMode": "ipvs"}
    assert plan_hash(PolicySpec.model_validate(slower)) == h
    assert plan_hash(PolicySpec.model_validate(wider)) != h
    assert plan_hash(PolicySpec.model_validate(ipvs)) != h
