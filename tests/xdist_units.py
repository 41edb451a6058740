"""The controller's side of ``tests.schedule``: an xdist scheduler that hands out units.

xdist's own ``loadgroup`` marks a test's group by renaming its node id, which pytest 9 no
longer lets a plugin do; so the workers write ``{node id: unit}`` (all the same, they plan on
the same collection) to a file the controller names, and this scheduler groups by it. It is
``loadscope`` with that grouping and the workers' order (longest unit first) kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling


class UnitScheduling(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log: Any, units: Path) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the workers' order is the plan
        self.units_file = units
        self.units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.units is None:
            self.units = json.loads(self.units_file.read_text())
        return self.units.get(nodeid, nodeid)
