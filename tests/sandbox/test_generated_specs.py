"""Generated specs: the real API server and the models agree, and the engine survives them.

Issue 15 item 2. ``tests.spec_strategies.generate`` makes ``COUNT`` specs from a fixed seed
(``PROXYMODE_SPEC_SEED`` picks another run), good ones and the mistakes people make. Each
goes to the sandbox's kube-apiserver as a server-side dry-run create (the CRD from crds/,
its schema and CEL rules, ``fieldValidation=Strict`` as kubectl sends it) and to the models
exactly as the operator and the plugin read the wire (``models.from_wire``):

- both accept or both refuse; a refusal carries a message that names the field (the API
  server's ``spec.…`` path, the models' dotted location);
- what the API server stores (its defaults applied) reads back through the models.

Every spec accepted here (the same seed, the same specs, the same verdicts: that is what this
test asserts) runs through the controller model to an end state in
``tests/unit/engine/test_generated_specs.py``, sharded so the suite's workers share it.
The dry-runs go 8 at a time; nothing is stored.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from proxymode.api import models
from tests.spec_strategies import COUNT, SEED, generate

G, V, P = models.GROUP, models.VERSION, models.PLURAL


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    message: str
    stored: dict[str, Any] | None = None


def body(index: int, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": models.KIND,
        "metadata": {"name": f"gen-{SEED % 10000}-{index}"},
        "spec": spec,
    }


def ask_api(custom: client.CustomObjectsApi, index: int, spec: dict[str, Any]) -> Verdict:
    try:
        stored = custom.create_cluster_custom_object(
            G, V, P, body(index, spec), dry_run="All", field_validation="Strict"
        )
    except ApiException as e:
        if e.status not in (400, 422):
            raise
        return Verdict(False, str(json.loads(e.body).get("message", "")))
    return Verdict(True, "", dict(stored))


def ask_models(index: int, spec: dict[str, Any]) -> Verdict:
    try:
        models.from_wire(body(index, spec))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return Verdict(False, f"{where}: {first['msg']}")
    return Verdict(True, "")


@pytest.fixture(scope="module")
def custom(api: client.ApiClient, crd: str) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def test_api_server_and_models_agree(
    custom: client.CustomObjectsApi,
) -> None:
    specs = generate(COUNT, SEED)
    assert len(specs) >= 200
    with ThreadPoolExecutor(8) as pool:
        server = list(pool.map(lambda item: ask_api(custom, *item), enumerate(specs)))
    local = [ask_models(i, s) for i, s in enumerate(specs)]
    disagree = [
        (i, specs[i], s.message or "accepted", m.message or "accepted")
        for i, (s, m) in enumerate(zip(server, local, strict=True))
        if s.accepted != m.accepted
    ]
    assert not disagree, "\n".join(
        f"#{i} {json.dumps(spec)}\n  api: {a}\n  models: {b}" for i, spec, a, b in disagree[:10]
    )
    refused = [(s, m) for s, m in zip(server, local, strict=True) if not s.accepted]
    for s, m in refused:
        assert "spec" in s.message, s.message  # the API server names the field
        assert m.message.startswith("spec"), m.message  # so do the models
    accepted = [s.stored for s in server if s.accepted and s.stored is not None]
    assert len(accepted) >= COUNT // 5, f"only {len(accepted)} of {COUNT} accepted"
    for stored in accepted:
        models.from_wire(stored)  # the API server's defaults read back
    print(
        f"\ngenerated specs (seed {SEED}): {len(specs)}, accepted {len(accepted)},"
        f" refused {len(refused)}"
    )
