"""The reachability measure itself (tests/sandbox/reach.py), on made-up samples: an outage
counts as overlapping another only when both last together for one sample's resolution."""

from __future__ import annotations

from tests.sandbox.reach import ECHO_TIMEOUT, Reachability


def _overlap(samples: dict[str, list[tuple[float, bool]]]) -> tuple[int, float]:
    reach = Reachability.__new__(Reachability)
    reach.samples = samples
    return reach.overlap()


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
