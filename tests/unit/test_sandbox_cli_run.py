"""`make run` stops the sandbox's operator when $KUBECONFIG names the sandbox, in a list too."""

from __future__ import annotations

from pathlib import Path

from proxymode_sandbox import cli


class _Box:
    """The sandbox as `_stop_operator` reads it, with its operator running."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.stopped = False

    def operator_record(self) -> object:
        return type("Record", (), {"pid": 4242})()

    def stop_operator(self) -> None:
        self.stopped = True


def test_make_run_stops_the_sandbox_operator_for_a_kubeconfig_list(tmp_path: Path) -> None:
    box = _Box(tmp_path / "kubeconfig")
    box.kubeconfig.write_text("{}")
    cli._stop_operator(box, f"{box.kubeconfig}:{tmp_path / 'other'}")  # type: ignore[arg-type]
    assert box.stopped, "two operators act on the sandbox's policies"
