"""The watch cache's view of a verification Job: never judged before its pod's report is seen."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes import client

from proxymode.engine.observed import CleanupJobView, JobKind
from proxymode.kube.cache import PodRecord
from proxymode.kube.observe import Observer

JOB = "proxymode-verify-to-nft-0123456789"


class _Cache:
    """The two watches at one moment: the Job's Complete event has arrived, its pod's
    terminated status (with the report) not yet (separate streams, no order between them)."""

    def jobs(self, namespace: str, policy: str) -> list[CleanupJobView]:
        created = datetime(2026, 12, 1, tzinfo=UTC)
        return [CleanupJobView(JOB, "n1", succeeded=True, created=created, kind=JobKind.VERIFY)]

    def pods(self, namespace: str) -> list[PodRecord]:
        return [PodRecord(JOB + "-abcde", "n1", "job-uid", False, 0, False, None, job=JOB)]


def test_a_verification_job_is_not_judged_before_its_report_is_seen() -> None:
    observer = Observer(client.ApiClient(), cache=_Cache())  # type: ignore[arg-type]
    (job,) = observer._jobs("kube-system", "to-nft")
    assert job.message or not (job.succeeded or job.failed), job
