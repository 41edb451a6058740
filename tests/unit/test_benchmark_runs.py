"""The benchmark still runs (tiny sizes): it is not part of the suite's timing, only kept alive."""

from __future__ import annotations

import pytest

from benchmarks.engine_scale import main


def test_engine_scale_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sizes", "20,40", "--looks", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "nodes"
    assert [line.split()[0] for line in lines[1:]] == ["20", "40"]
