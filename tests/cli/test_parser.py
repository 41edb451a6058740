"""The command line: kubectl's conventions (flags before or after the command, help prefix)."""

from __future__ import annotations

import pytest

from proxymode.cli.main import build_parser

COMMANDS = (
    "list",
    "status",
    "promote",
    "abort",
    "retry",
    "pause",
    "resume",
    "plan",
    "advise",
    "report",
    "version",
)


def test_standard_flags_go_before_or_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["--kubeconfig", "k", "--context", "c", "-o", "json", "status", "p"])
    after = parser.parse_args(["status", "p", "--kubeconfig", "k", "--context", "c", "-o", "json"])
    for args in (before, after):
        assert (args.kubeconfig, args.context, args.output, args.name) == ("k", "c", "json", "p")
    # Every command but report (whose -o is its file) takes them on either side.
    for command in [c for c in COMMANDS if c != "report"]:
        named = (
            [command, "p"] if command not in ("list", "advise", "version", "plan") else [command]
        )
        if command == "plan":
            named = [command, "-f", "p.yaml"]
        for argv in ([*named, "-o", "yaml"], ["-o", "yaml", *named]):
            assert parser.parse_args(argv).output == "yaml", argv
    plain = parser.parse_args(["list"])
    assert (plain.kubeconfig, plain.context, plain.output) == (None, None, "text")


def test_status_timeout_reads_durations() -> None:
    args = build_parser().parse_args(["status", "p", "--timeout", "1m30s", "-w"])
    assert args.timeout == 90 and args.watch


def test_report_takes_a_file_for_o() -> None:
    args = build_parser().parse_args(["report", "p", "-o", "run.html"])
    assert args.output == "run.html" and args.format is None


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_prefixed_kubectl_proxymode(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kubectl proxymode {command}")
    assert f"kubectl proxymode {command}:" in out


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["status"])
    assert done.value.code == 2
    assert "usage: kubectl proxymode status" in capsys.readouterr().err
