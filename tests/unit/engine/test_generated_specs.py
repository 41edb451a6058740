"""Every generated spec the models accept runs through the controller model to an end state.

Issue 15 item 2: "no accepted spec crashes or wedges the engine". The specs are the run's
(``tests.spec_strategies``, the same seed as ``tests/sandbox/test_generated_specs.py``,
which asserts that the API server accepts exactly these); ``endstate.run_to_end`` drives
each, checking the invariants at every look, to Completed, RolledBack or Failed. Sharded
so the suite's workers share the runs.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from pydantic import ValidationError

from proxymode.api import models
from tests.spec_strategies import COUNT, SEED, generate
from tests.unit.engine.endstate import END, run_to_end

SHARDS = 8


@cache
def accepted() -> tuple[dict[str, Any], ...]:
    out = []
    for index, spec in enumerate(generate(COUNT, SEED)):
        body = {
            "apiVersion": f"{models.GROUP}/{models.VERSION}",
            "kind": models.KIND,
            "metadata": {"name": f"gen-{index}"},
            "spec": spec,
        }
        try:
            out.append(models.from_wire(body).spec.wire())
        except ValidationError:
            continue
    return tuple(out)


def test_enough_specs_are_accepted_to_matter() -> None:
    assert len(accepted()) >= COUNT // 5


@pytest.mark.parametrize("shard", range(SHARDS))
def test_accepted_specs_reach_an_end_state(shard: int) -> None:
    ends: dict[str, int] = {}
    for spec in accepted()[shard::SHARDS]:
        phase, _ = run_to_end(spec)
        assert phase in END
        ends[phase] = ends.get(phase, 0) + 1
    print(f"\nshard {shard}: end states {ends}")
