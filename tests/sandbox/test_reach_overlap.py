"""The reachability measure itself (tests/sandbox/reach.py), on made-up samples: an outage
counts as overlapping another only when both last together for one sample's resolution."""

from __future__ import annotations

from tests.sandbox.reach import ECHO_TIMEOUT, Reachability


def _reach(samples: dict[str, list[tuple[float, bool]]]) -> Reachability:
    reach = Reachability.__new__(Reachability)
    reach.samples = samples
    return reach


def _overlap(samples: dict[str, list[tuple[float, bool]]]) -> tuple[int, float]:
    return _reach(samples).overlap()


def test_outages_that_follow_each_other_within_one_sample_do_not_overlap() -> None:
    worst, _ = _overlap(
        {
            "a": [(0.0, True), (1.0, False), (1.15, False), (1.3, True)],
            "b": [(1.25, False), (1.4, False), (1.55, True)],
        }
    )
    assert worst == 1


def test_two_nodes_down_together_for_seconds_overlap() -> None:
    worst, seconds = _overlap(
        {
            "a": [(0.0, False), (1.0, False), (2.0, False), (3.0, True)],
            "b": [(0.5, False), (1.5, False), (2.5, False), (3.5, True)],
        }
    )
    assert worst == 2 and seconds > 2 * ECHO_TIMEOUT


def test_three_down_at_the_end_of_the_samples_still_count() -> None:
    down = [(t / 10, False) for t in range(20)]
    worst, _ = _overlap({"a": down, "b": down, "c": [(0.05, True), *down[1:]]})
    assert worst == 3


def test_no_failure_is_zero() -> None:
    assert _overlap({"a": [(0.0, True)], "b": [(0.1, True)]}) == (0, 0.0)


def test_a_lone_miss_beside_another_nodes_outage_is_not_an_overlap() -> None:
    """CI's run of ebf78b6: one node missed one sample (rules in place, backends
    answering) while another switched for seconds."""
    switching = [(t / 10, not 10 <= t < 50) for t in range(60)]
    lone = [(t / 10 + 0.05, t != 20) for t in range(60)]
    reach = _reach({"a": switching, "b": lone})
    assert reach.overlap()[0] == 1
    assert reach.lone_misses() == {"a": 0, "b": 1}
    assert reach.flapping() == {}


def test_two_misses_in_a_row_beside_an_outage_overlap() -> None:
    switching = [(t / 10, not 10 <= t < 50) for t in range(60)]
    two = [(0.05, True), (1.05, True), (2.0, False), (3.15, False), (4.3, True), (4.45, True)]
    assert _overlap({"a": switching, "b": two})[0] == 2


def test_a_miss_at_the_edge_of_the_samples_is_never_lone() -> None:
    down_last = [(t / 10, t != 59) for t in range(60)]
    assert _reach({"a": down_last}).lone_misses() == {"a": 0}


def test_a_node_losing_every_other_sample_is_flapping() -> None:
    flapping = [(t / 10, t % 2 == 0) for t in range(61)]
    reach = _reach({"a": flapping})
    assert reach.lone_misses() == {"a": 30}
    assert "a" in reach.flapping()
