"""Shared pytest configuration: tests mirror the layers (unit/ is pure, sandbox/ is real).

Two things happen here for every test directory, so tests added later need nothing of their
own:

- Marks by what a test needs: everything under tests/sandbox, and any test that uses a
  ``sandbox`` fixture (whichever conftest defines it), is marked ``sandbox``
  (``-m "not sandbox"`` runs what needs no control plane). A ``pytestmark`` in a conftest
  would mark nothing: pytest reads it from test modules only.
- Under pytest-xdist (``make test`` runs workers side by side, each with its own sandbox),
  the tests are grouped and ordered as ``tests.schedule`` decides, and the controller keeps
  the measured durations in pytest's cache so the next run orders by them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests import schedule

TESTS = Path(__file__).resolve().parent
CACHE_KEY = "proxymode/durations"


def _narrow_scopes(item: pytest.Item) -> frozenset[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return frozenset()
    scopes = set()
    for name in item.fixturenames:  # type: ignore[attr-defined]
        defs = info.name2fixturedefs.get(name)
        if defs:
            scope = defs[-1].scope
            if scope not in ("function", "session"):
                scopes.add(scope)
    return frozenset(scopes)


def _info(item: pytest.Item) -> schedule.CaseInfo:
    module = item.nodeid.split("::", 1)[0]
    return schedule.CaseInfo(
        nodeid=item.nodeid,
        module=module,
        package=module.rsplit("/", 1)[0],
        narrow_scopes=_narrow_scopes(item),
        uses_sandbox="sandbox" in getattr(item, "fixturenames", ()),
    )


def _under_xdist(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


UNITS_KEY = "proxymode_units"
"""workerinput key: the file where workers leave ``{node id: unit}`` for the controller."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    infos = [_info(item) for item in items]
    for item, info in zip(items, infos, strict=True):
        if info.uses_sandbox or item.path.is_relative_to(TESTS / "sandbox"):
            item.add_marker(pytest.mark.sandbox)
    units_file = getattr(config, "workerinput", {}).get(UNITS_KEY)
    if not units_file:
        return
    # Every worker runs this on the same collection with the same inputs, so all of them
    # agree on the order (xdist refuses to run otherwise) and write the same units.
    cache = getattr(config, "cache", None)
    cached = cache.get(CACHE_KEY, {}) if cache else {}
    plan = schedule.plan(infos, schedule.load_durations(cached))
    units = {info.nodeid: plan.groups.get(i, info.nodeid) for i, info in enumerate(infos)}
    partial = Path(f"{units_file}.{os.getpid()}")
    partial.write_text(json.dumps(units))
    partial.replace(units_file)
    items[:] = [items[i] for i in plan.order]


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and not _under_xdist(config):
        config.pluginmanager.register(_Units(), "proxymode-units")


class _Units:
    """Controller side: tells the workers where to leave their units, schedules by them."""

    def __init__(self) -> None:
        self.dir: Path | None = None

    @property
    def path(self) -> Path:
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="proxymode-units-"))
        return self.dir / "units.json"

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[UNITS_KEY] = str(self.path)

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":
            return None
        from tests.xdist_units import UnitScheduling  # noqa: PLC0415 - only under xdist

        return UnitScheduling(config, log, self.path)

    def pytest_unconfigure(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


_measured: dict[str, float] = {}
_spans: dict[str, list[tuple[float, float, str]]] = {}
"""Worker id -> (start, stop, node id) of every test phase it ran (controller side)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = schedule.plain_nodeid(report.nodeid)
    _measured[nodeid] = _measured.get(nodeid, 0.0) + report.duration
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if worker is not None:
        _spans.setdefault(worker, []).append((report.start, report.stop, nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each worker's share: when it finished and what kept it busy longest, so a run that
    misses its budget shows whether one worker's units or the whole load is the cause."""
    if not _spans:
        return
    first = min(start for spans in _spans.values() for start, _, _ in spans)
    terminalreporter.section("workers (seconds from the first test's start)")
    for worker in sorted(_spans):
        spans = _spans[worker]
        per_module: dict[str, float] = {}
        for start, stop, nodeid in spans:
            module = nodeid.split("::", 1)[0]
            per_module[module] = per_module.get(module, 0.0) + stop - start
        top = sorted(per_module.items(), key=lambda kv: -kv[1])[:3]
        terminalreporter.write_line(
            f"{worker}: done at {max(stop for _, stop, _ in spans) - first:.0f}, busy "
            f"{sum(stop - start for start, stop, _ in spans):.0f}; longest: "
            + ", ".join(f"{m} {t:.0f}" for m, t in top)
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    # The cache plugin is absent under ``-p no:cacheprovider``; durations then go unrecorded.
    cache = getattr(config, "cache", None)
    if _under_xdist(config) or cache is None or not _measured:
        return
    known = cache.get(CACHE_KEY, {})
    known.update({k: round(v, 2) for k, v in _measured.items()})
    cache.set(CACHE_KEY, known)
    if os.environ.get("PROXYMODE_WRITE_DURATIONS"):
        committed = schedule.load_durations()
        committed.update({k: round(v, 2) for k, v in _measured.items()})
        schedule.write_durations(committed)
