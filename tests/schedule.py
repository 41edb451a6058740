"""How the suite is split between parallel workers (pytest-xdist, ``make test``).

The suite spends most of its time waiting on real clusters (bakes, analysis rounds, rollouts),
so it runs several workers, each with its own sandbox (session fixtures are per worker, see
docs/decisions/0040-parallel-suite.md). This module decides, for the collected tests, which
ones must stay together on one worker and in which order the work is handed out:

- A test that uses a fixture scoped to its module, class or package (the examples' own
  sandbox, the chart's, a module's second Prometheus) stays with every test of that module
  (or package), so the fixture is built once.
- Short tests (estimated under ``SHORT_SECONDS``) stay with their module too: handing them out
  one by one costs more than they take. So do tests that use no sandbox: what they share is
  session fixtures of their own directory (the chart's wheel and image venv), built once.
- Every other test (a long case on the worker's session sandbox) is a unit of its own.
- Units go out longest first (estimates from measured durations, ``DURATIONS``), so the long
  ones start at once and the short ones fill the gaps at the end.

Pure: the conftest gives it what it knows of each test and applies the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
"""Measured seconds per test id (setup + call + teardown), from a whole ``make test`` run (its
5 workers share 2 cores, so these are the times the order is for; ``PROXYMODE_WRITE_DURATIONS=1``
writes them). Only their proportions matter: they order the units, longest first."""

SHORT_SECONDS = 2.0
UNKNOWN_SANDBOX_SECONDS = 30.0
"""A test nobody has measured yet that uses a sandbox: a migration takes about that long."""
UNKNOWN_SECONDS = 0.2


@dataclass(frozen=True)
class CaseInfo:
    """What scheduling needs to know of one collected test."""

    nodeid: str
    module: str
    """The test's file, as in its node id."""
    package: str
    """The directory of that file."""
    narrow_scopes: frozenset[str]
    """Scopes of the fixtures it uses that are neither ``function`` nor ``session``."""
    uses_sandbox: bool


def plain_nodeid(nodeid: str) -> str:
    """A node id without the ``@group`` suffix that xdist's loadgroup appends."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") and at > nodeid.rfind("::") else nodeid


def load_durations(*overrides: Mapping[str, float]) -> dict[str, float]:
    """The committed durations, each mapping in ``overrides`` taking precedence in turn."""
    try:
        known: dict[str, float] = json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        known = {}
    for more in overrides:
        known.update(more)
    return known


def estimate(test: CaseInfo, durations: Mapping[str, float]) -> float:
    known = durations.get(plain_nodeid(test.nodeid))
    if known is not None:
        return known
    return UNKNOWN_SANDBOX_SECONDS if test.uses_sandbox else UNKNOWN_SECONDS


def group_of(test: CaseInfo, seconds: float) -> str | None:
    """The name of the unit ``test`` must run in, or None when it is a unit of its own."""
    if "package" in test.narrow_scopes:
        return test.package
    if test.narrow_scopes or seconds < SHORT_SECONDS or not test.uses_sandbox:
        return test.module
    return None


@dataclass(frozen=True)
class Plan:
    order: list[int]
    """Indexes into the tests, in the order to hand them out."""
    groups: dict[int, str]
    """Index -> the unit it belongs to (tests absent here are units of their own)."""
    unit_seconds: dict[str, float]
    """Estimated seconds of each unit, keyed by group name or node id."""


def plan(tests: Sequence[CaseInfo], durations: Mapping[str, float]) -> Plan:
    """Units longest first; inside a unit, the tests keep their collection order."""
    groups: dict[int, str] = {}
    members: dict[str, list[int]] = {}
    seconds: dict[str, float] = {}
    for i, test in enumerate(tests):
        took = estimate(test, durations)
        group = group_of(test, took)
        key = test.nodeid if group is None else group
        if group is not None:
            groups[i] = group
        members.setdefault(key, []).append(i)
        seconds[key] = seconds.get(key, 0.0) + took
    first = {key: idx[0] for key, idx in members.items()}
    units = sorted(members, key=lambda k: (-seconds[k], first[k]))
    return Plan([i for k in units for i in members[k]], groups, seconds)


def write_durations(durations: Mapping[str, float]) -> None:
    """Store ``durations`` as the committed estimates (sorted, one test a line)."""
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
