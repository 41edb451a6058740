"""How ``make test`` splits the suite between workers (tests/schedule.py): pure rules."""

from __future__ import annotations

from tests.schedule import CaseInfo, group_of, plain_nodeid, plan


def info(nodeid: str, *scopes: str, sandbox: bool = False) -> CaseInfo:
    module = nodeid.split("::", maxsplit=1)[0]
    return CaseInfo(nodeid, module, module.rsplit("/", 1)[0], frozenset(scopes), sandbox)


def test_module_fixtures_and_short_tests_stay_with_their_module() -> None:
    assert group_of(info("t/a.py::x", "module"), 100) == "t/a.py"
    assert group_of(info("t/a.py::x", "class"), 100) == "t/a.py"
    assert group_of(info("t/a.py::x", "package"), 100) == "t"
    assert group_of(info("t/a.py::x"), 0.5) == "t/a.py", "short: batched"
    assert group_of(info("t/a.py::x"), 60) == "t/a.py", "long, no sandbox: shares the module's"
    assert group_of(info("t/a.py::x", sandbox=True), 60) is None, "long on the session sandbox"


def test_units_go_out_longest_first_and_keep_their_order_inside() -> None:
    tests = [
        info("unit/u.py::a"),
        info("unit/u.py::b"),
        info("sb/m.py::short", sandbox=True),
        info("sb/m.py::long", sandbox=True),
        info("ex/e.py::one", "module", sandbox=True),
        info("ex/e.py::two", "module", sandbox=True),
        info("sb/new.py::unmeasured", sandbox=True),
    ]
    durations = {
        "unit/u.py::a": 0.1,
        "unit/u.py::b": 0.1,
        "sb/m.py::short": 10,
        "sb/m.py::long": 90,
        "ex/e.py::one": 80,
        "ex/e.py::two": 70,
    }
    p = plan(tests, durations)
    assert [tests[i].nodeid for i in p.order] == [
        "ex/e.py::one",
        "ex/e.py::two",  # 150 s together
        "sb/m.py::long",
        "sb/new.py::unmeasured",  # unknown sandbox test: 30 s
        "sb/m.py::short",
        "unit/u.py::a",
        "unit/u.py::b",
    ]
    assert {tests[i].nodeid: g for i, g in p.groups.items()} == {
        "unit/u.py::a": "unit/u.py",
        "unit/u.py::b": "unit/u.py",
        "ex/e.py::one": "ex/e.py",
        "ex/e.py::two": "ex/e.py",
    }
    assert p.unit_seconds["ex/e.py"] == 150


def test_the_group_suffix_is_not_part_of_a_test_id() -> None:
    assert plain_nodeid("t/a.py::x@t/a.py") == "t/a.py::x"
    assert plain_nodeid("t/a.py::x[p@1]") == "t/a.py::x[p@1]"
    assert plain_nodeid("t/a.py::x[p]@t/a.py") == "t/a.py::x[p]"
