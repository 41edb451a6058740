"""The adapter's pure helpers: the status merge that decides whether to patch, what of a
policy wakes its daemon, wake-ups coalescing, the watch cache's reduced objects, and the
seniority priority of peered replicas. No API server: these take and return plain data."""

from __future__ import annotations

import asyncio
from typing import Any

from proxymode.__main__ import seniority
from proxymode.kube.cache import job_record, pod_record
from proxymode.kube.reconcile import _merged
from proxymode.kube.wakeups import Wakeups, policy_key
from proxymode.kube.watched import _backoff


def test_merge_patch_semantics_decide_whether_anything_changed() -> None:
    current = {"phase": "Analyzing", "stages": [{"name": "a"}], "baseline": {"x": 1, "y": 2}}
    assert _merged(current, {"phase": "Analyzing", "baseline": {"x": 1}}) == current
    assert _merged(current, {"message": None}) == current  # clearing an absent field: no change
    assert _merged(current, {"baseline": {"y": None}}) == {**current, "baseline": {"x": 1}}
    assert _merged(current, {"stages": []})["stages"] == []  # a list is replaced, not merged


def _policy(generation: int, action: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"generation": generation, "annotations": {}}
    if action:
        meta["annotations"]["proxymode.io/action"] = action
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Analyzing"}}


def test_only_spec_action_and_deletion_wake_a_policy_not_its_own_status() -> None:
    base = _policy(3)
    with_status = {**base, "status": {"phase": "Paused", "message": "changed"}}
    assert policy_key(base) == policy_key(with_status)
    assert policy_key(base) != policy_key(_policy(4))
    assert policy_key(base) != policy_key(_policy(3, action="abort"))
    assert policy_key(base) != policy_key(_policy(3, deleting=True))


def test_wakeups_coalesce_and_the_requeue_is_the_fallback() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        wakeups = Wakeups()
        wakeups.bind(asyncio.get_running_loop())
        stopped = asyncio.Event()
        first = wakeups.policy_changed("p", _policy(1))  # first sight: nothing to compare
        wakeups.policy_changed("p", _policy(2))
        wakeups.wake("p")  # two changes during one look ...
        woken = await wakeups.wait("p", 5.0, stopped)  # ... make one more look
        again = await wakeups.wait("p", 0.05, stopped)  # and then only the fallback
        return first, woken, again

    first, woken, again = asyncio.run(scenario())
    assert (first, woken, again) == (False, True, False)


def test_a_change_during_the_first_look_wakes_the_daemon() -> None:
    """The first look creates the target pair and patches the source; the watches report
    those changes (``wake_all``) while it runs, before the daemon first waits. Tracked from
    the start, they make the next look come at once, not on the fallback."""

    async def scenario() -> tuple[bool, bool]:
        wakeups = Wakeups()
        wakeups.bind(asyncio.get_running_loop())
        stopped = asyncio.Event()
        wakeups.track("p")
        wakeups.wake_all()  # during the first look
        woken = await wakeups.wait("p", 5.0, stopped)
        untracked = Wakeups()
        untracked.bind(asyncio.get_running_loop())
        untracked.wake_all()  # nobody known: nothing kept
        missed = await untracked.wait("q", 0.05, stopped)
        return woken, missed

    assert asyncio.run(scenario()) == (True, False)


def test_merge_drops_null_fields_inside_list_items_as_the_api_server_does() -> None:
    """The server keeps ``history[].stage: null`` as no field at all; a comparison that
    kept the null found every look's status changed and wrote it, idle looks included."""
    stored = {"history": [{"phase": "Preflight", "reason": "PreflightStarted"}]}
    patch = {"history": [{"phase": "Preflight", "reason": "PreflightStarted", "stage": None}]}
    assert _merged(stored, patch) == stored


def test_the_cache_keeps_only_what_the_engine_reads() -> None:
    pod = {
        "metadata": {
            "name": "kube-proxy-abc",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"uid": "u1", "controller": True}],
            "labels": {"big": "x" * 1000},
            "annotations": {"proxymode.io/config-hash": "h1", "big": "y" * 1000},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "kube-proxy"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}
            ],
            "containerStatuses": [{"restartCount": 2}],
        },
    }
    record = pod_record(pod)
    assert (record.node, record.owner_uid, record.ready, record.restarts) == ("n1", "u1", True, 2)
    assert record.ready_changed == "2026-01-01T00:01:00Z"
    assert record.config_hash == "h1", "which target template made it (restore.target_rolling)"
    heartbeat = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "99"}}
    assert pod_record(heartbeat) == record, "a change the engine cannot act on is no change"
    job = job_record(
        {
            "metadata": {
                "name": "j",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"proxymode.io/policy": "p", "proxymode.io/node": "n1"},
            },
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        }
    )
    assert (job.policy, job.view.node, job.view.succeeded, job.view.failed) == (
        "p",
        "n1",
        True,
        False,
    )
    assert job.view.created is not None


def test_a_refused_watch_waits_longer_each_time_up_to_half_a_minute() -> None:
    assert [_backoff(n) for n in (1, 2, 3, 4, 5, 6, 10)] == [1, 2, 4, 8, 16, 30, 30]


def test_seniority_ranks_the_first_replica_started_highest() -> None:
    older, newer = seniority(1_800_000_000.0, 0), seniority(1_800_000_000.001, 99)
    assert older > newer, "one millisecond earlier outranks any tie-break"
    assert seniority(1_800_000_000.0, 1) != seniority(1_800_000_000.0, 2)
    assert 0 < newer < older < 2**53, "exact in the JSON the API server keeps"


def test_resource_versions_compare_as_numbers_and_only_when_they_can() -> None:
    """KEP-5504 (GA in 1.35): a resourceVersion is a decimal without leading zeros, and two
    of one resource compare as numbers; anything else must never be taken as caught up."""
    from proxymode.kube.watched import at_least, comparable  # noqa: PLC0415

    assert at_least("10", "9"), "as numbers, not as text ('10' < '9' as text)"
    assert at_least("42", "42")
    assert not at_least("9", "10")
    for odd in ("", "007", "12a", "-1", "\uff11\uff12", "1.5"):
        assert not comparable(odd), odd
        assert not at_least(odd, "1") and not at_least("1", odd), odd
    assert comparable("0") and comparable("123456789012345678901234567890")


def _named(uid: str, generation: int) -> dict[str, Any]:
    body = _policy(generation)
    body["metadata"]["uid"] = uid
    return body


def test_an_old_policy_s_deletion_does_not_forget_its_successor_of_the_same_name() -> None:
    """kopf handles each object's events in its own worker: the old policy's DELETED may
    come after the first events of a new policy of the same name. Only the uid last seen
    under the name is forgotten; and a new uid's first event is a first sight, not a change."""
    wakeups = Wakeups()
    wakeups.policy_changed("p", _named("old", 1))
    assert not wakeups.policy_changed("p", _named("new", 5)), "another policy: nothing to compare"
    assert not wakeups.gone("p", "old"), "the successor's state is kept"
    assert wakeups.policy_changed("p", _named("new", 6)), "and its spec edits still wake it"
    assert wakeups.gone("p", "new")
    assert not wakeups.policy_changed("p", _named("new", 7)), "forgotten: a first sight again"
    assert wakeups.gone("q", None), "a name never seen is simply forgotten"
