"""The operator image, built with podman from ./Dockerfile and run under the chart's security
context (no Docker engine, no registry: images/build.sh, docs/decisions/0060).

Checked: the build is cached by its content key (a second run builds nothing); the image
label carries the key; the entrypoint's --help under the chart's own security context
(read-only root with only the chart's /tmp emptyDir writable, UID 10001, every capability
dropped, no privilege escalation, the memory limit); every proxymode module and kopf import
in the image from bytecode compiled at build time (a read-only root cannot cache any); the
image's filesystem holds no pip, no build leftovers and nothing of the host's CA bundle that
was bind-mounted into the build; the OCI archive names the same image. The size is printed.
The operator running in the image against a real API server is test_image_sandbox.py.
"""

from __future__ import annotations

import json
import re
import tarfile
import uuid
from pathlib import Path

import pytest

from tests.chart.conftest import IMAGE_UID, helm_template
from tests.image.conftest import (
    VERSION,
    BuiltImage,
    build_image,
    chart_security_flags,
    deployment_of,
    load_all,
    podman,
)

# The first test pays for a cold build (debootstrap + build, a few minutes on a busy machine).
pytestmark = pytest.mark.timeout(1800)

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


@pytest.fixture(scope="module")
def security_flags(bins: Path) -> list[str]:
    return chart_security_flags(deployment_of(load_all(helm_template(bins).stdout)))


def test_image_is_built_with_its_content_key_and_its_size_is_reported(
    built_image: BuiltImage, capsys: pytest.CaptureFixture[str]
) -> None:
    assert built_image.name == f"localhost/proxymode/proxymode-operator:{VERSION}"
    labels = json.loads(
        podman(
            built_image, "image", "inspect", "--format", "{{json .Labels}}", built_image.name
        ).stdout
    )
    assert labels["io.proxymode.build-key"] == built_image.key
    assert labels["org.opencontainers.image.title"] == "proxymode-operator"
    # Idempotent: the same inputs, nothing built, the same image. And a container of the image
    # that runs meanwhile is left alone: test workers side by side each run the script while
    # another's operator runs in the image (the script once removed every such container).
    bystander = f"pm-bystander-{uuid.uuid4().hex[:6]}"
    podman(built_image, "run", "--detach", f"--name={bystander}", "--network=none",
           "--entrypoint=sleep", built_image.name, "300")  # fmt: skip
    try:
        again, result = build_image()
        running = podman(built_image, "inspect", "--format", "{{.State.Running}}", bystander,
                         check=False)  # fmt: skip
    finally:
        podman(built_image, "rm", "--force", "--time=0", bystander, check=False)
    assert again["IMAGE_ID"] == built_image.image_id and again["KEY"] == built_image.key
    assert "nothing to build" in result.stderr
    assert running.stdout.strip() == "true", f"the build removed a running container: {running}"
    with capsys.disabled():
        print(
            f"\n[image] {built_image.name}: {built_image.size_bytes / 1e6:.1f} MB in the local"
            f" store, OCI archive {built_image.archive.stat().st_size / 1e6:.1f} MB"
            f" ({built_image.archive})"
        )


def test_help_runs_under_the_charts_security_context(
    built_image: BuiltImage, security_flags: list[str]
) -> None:
    assert {"--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges"} <= set(
        security_flags
    )
    assert f"--user={IMAGE_UID}:{IMAGE_UID}" in security_flags
    result = podman(
        built_image, "run", "--rm", "--network=none", *security_flags, built_image.name, "--help"
    )
    assert "--liveness" in result.stdout and "--peering" in result.stdout
    # The image's own default: the chart's liveness endpoint.
    cmd = podman(
        built_image, "image", "inspect", "--format", "{{json .Config.Cmd}}", built_image.name
    )
    assert json.loads(cmd.stdout) == ["--liveness=http://0.0.0.0:8080/healthz"]


SMOKE = r"""
import importlib, os, pkgutil, sys, tempfile
import proxymode
# The kubectl plugin's report needs matplotlib (the `cli` extra), which the operator image
# leaves out; the plugin runs on a person's machine, not in the operator's pod.
PLUGIN_REPORT = ("proxymode.cli.charts", "proxymode.cli.document")
names = sorted(
    m.name for m in pkgutil.walk_packages(proxymode.__path__, "proxymode.")
    if m.name not in PLUGIN_REPORT
)
for name in names:
    importlib.import_module(name)
import kopf, kubernetes.client, kubernetes.dynamic  # what proxymode.__main__ loads
# Writable: only the chart's emptyDir.
with tempfile.NamedTemporaryFile() as f:
    assert f.name.startswith("/tmp/"), f.name
for path in ("/probe", "/opt/proxymode/probe", "/nonexistent"):  # the last: $HOME
    try:
        os.mkdir(path)
    except OSError as e:
        assert e.errno in (13, 30), e  # EACCES, EROFS
    else:
        raise AssertionError(f"could create {path}")
print(os.getuid(), os.getgid(), len(names), "modules")
"""


def test_every_proxymode_module_imports_from_build_time_bytecode(
    built_image: BuiltImage, security_flags: list[str]
) -> None:
    result = podman(
        built_image,
        "run",
        "--rm",
        "--network=none",
        *security_flags,
        "--entrypoint=python",
        built_image.name,
        "-v",
        "-c",
        SMOKE,
    )
    uid, gid, count, _ = result.stdout.split()
    assert (int(uid), int(gid)) == (IMAGE_UID, IMAGE_UID) and int(count) > 20
    # `python -v` says where each module came from: with a read-only root, a module without
    # valid build-time bytecode would be compiled again at every start.
    stale = [line for line in result.stderr.splitlines() if "bytecode is stale" in line]
    assert not stale, stale[:5]
    from_pyc = re.findall(r"^# code object from '(/\S+\.pyc)'$", result.stderr, re.M)
    from_source = re.findall(r"^# code object from (/\S+\.py)$", result.stderr, re.M)
    assert not from_source, f"compiled at start, from source: {from_source[:5]}"
    assert any(p.endswith("/proxymode/__pycache__/handlers.cpython-311.pyc") for p in from_pyc)
    assert any("/kubernetes/client/" in p for p in from_pyc)
    assert any(p.startswith("/usr/lib/python3") for p in from_pyc), "the standard library too"
    assert "kubernetes.aio" not in result.stderr, "the asyncio client was left out of the image"


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def test_no_pip_no_build_leftovers(image_root: Path) -> None:
    site = next((image_root / "opt" / "proxymode" / "lib").glob("python3*/site-packages"))
    assert (site / "proxymode" / "handlers.py").is_file()
    assert not (site / "kubernetes" / "aio").exists()
    lib_dirs = [
        *image_root.glob("usr/lib/python3*/*-packages"),
        *image_root.glob("usr/local/lib/python3*/site-packages"),
        site,
    ]
    for d in lib_dirs:
        for package in ("pip", "setuptools", "wheel"):
            assert not (d / package).exists(), f"{package} is in {d.relative_to(image_root)}"
    for bin_dir in ("usr/bin", "usr/local/bin", "opt/proxymode/bin"):
        assert not list((image_root / bin_dir).glob("pip*")), bin_dir
    assert not (image_root / "src").exists() and not (image_root / "wheels").exists()
    assert not list(image_root.rglob("*.whl")), "a wheel was left in the image"
    for cache in ("root/.cache", "nonexistent", "var/lib/apt/lists", "tmp"):
        path = image_root / cache
        assert not path.exists() or not any(path.iterdir()), f"/{cache} is not empty"


def test_nothing_of_the_hosts_ca_bundle_is_in_the_image(image_root: Path) -> None:
    """The build bind-mounted the host's bundle for the RUN steps; none of it may stay.

    The host's own certificates (a proxy's CA, say) are those in its bundle that the image's
    ca-certificates package does not ship (/usr/share/ca-certificates): none of them may be
    in any certificate file of the image, its generated bundle included.
    """
    if not HOST_CA.is_file():
        pytest.skip(f"no {HOST_CA} on this host: nothing was mounted into the build")
    packaged: set[bytes] = set()
    for crt in (image_root / "usr/share/ca-certificates").rglob("*.crt"):
        packaged |= set(PEM.findall(crt.read_bytes()))
    assert len(packaged) > 50, "the image's ca-certificates package is missing"
    host_only = set(PEM.findall(HOST_CA.read_bytes())) - packaged
    if not host_only:
        pytest.skip(f"{HOST_CA} holds only what Debian ships: nothing would tell it apart")
    checked = 0
    for path in _files(image_root):
        if path.suffix in {".crt", ".pem"} or "/etc/ssl/" in str(path):
            checked += 1
            data = path.read_bytes()
            leaked = [c for c in host_only if c in data]
            assert not leaked, f"/{path.relative_to(image_root)} holds the host's own CA"
    assert checked > 50


def test_oci_archive_holds_this_image(built_image: BuiltImage) -> None:
    with tarfile.open(built_image.archive) as tar:
        names = set(tar.getnames())
        assert "oci-layout" in names and "index.json" in names

        def blob(digest: str) -> dict[str, object]:
            algo, _, hexdigest = digest.partition(":")
            member = tar.extractfile(f"blobs/{algo}/{hexdigest}")
            assert member is not None
            return dict(json.load(member))

        index_file = tar.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
        (entry,) = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == built_image.name
        manifest = blob(entry["digest"])
        config = manifest["config"]
        assert isinstance(config, dict)
        assert config["digest"] == f"sha256:{built_image.image_id}"


def test_the_verification_job_finds_its_tools_in_the_image(built_image: BuiltImage) -> None:
    """The verification Job runs this image as root with NET_ADMIN: its entry point and the
    rule readers it calls (iptables-save, nft, ip) must be on the image's PATH."""
    result = podman(
        built_image,
        "run",
        "--rm",
        "--network=none",
        "--user=0:0",
        "--entrypoint=/bin/sh",
        built_image.name,
        "-c",
        "proxymode verify-node --help && iptables-save --version && nft --version && ip -V",
    )
    assert "verify-node" in result.stdout or "--service" in result.stdout, result.stdout
    assert "iptables-save" in result.stdout and "nftables" in result.stdout, result.stdout
    assert "iproute2" in result.stdout or "ip utility" in result.stdout, result.stdout
