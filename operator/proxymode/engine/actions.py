"""What the engine asks for: changes to the cluster as plain data.

The Kubernetes adapter carries these out in order and stops at the first that fails
(a conflict, a precondition no longer true); the next reconcile sees the world again
and decides again. Label changes next to each other, on different nodes, it sends side by
side, so those beside a refused one may still land (decision 0072); the engine never
depends on their order. Every action is safe to repeat: creating what exists updates it,
labelling a node checks the label it expects first, patches carry a ``test`` of the
resourceVersion they were computed from, so nothing is blindly overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxymode.api.models import PolicyStatus


@dataclass(frozen=True)
class SaveBackup:
    """Create the backup ConfigMap (owned by the policy) with the snapshot; never overwrite it."""

    obj: Mapping[str, Any]


@dataclass(frozen=True)
class CreateObject:
    """Create an object that is not the operator's when it is absent; never overwrite one
    (a copy that lags may show it absent): the source ConfigMap made again from the
    snapshot."""

    obj: Mapping[str, Any]


@dataclass(frozen=True)
class ApplyObject:
    """Create or update an object the operator owns (the target ConfigMap and DaemonSet)."""

    obj: Mapping[str, Any]


@dataclass(frozen=True)
class PatchObject:
    """Apply a JSON patch (RFC 6902) to an object the operator does not own.

    ``ops`` starts with a ``test`` of ``/metadata/resourceVersion``, so a patch computed
    from a stale read fails instead of overwriting someone else's change.
    """

    api_version: str
    kind: str
    namespace: str
    name: str
    ops: Sequence[Mapping[str, Any]]
    why: str = ""


@dataclass(frozen=True)
class SetNodeMode:
    """Set (``value``) or remove (None) a node's ``proxymode.io/mode`` label.

    ``expect`` is the value the engine saw; the adapter refuses to change a node whose
    label differs now (a JSON patch ``test``), so two decisions never race.
    """

    node: str
    value: str | None
    expect: str | None


@dataclass(frozen=True)
class CreateJob:
    """Create a cleanup Job (a no-op when it exists)."""

    job: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteObject:
    api_version: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class EmitEvent:
    """A Kubernetes Event on the policy."""

    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"


@dataclass(frozen=True)
class ClearAction:
    """Remove the one-shot ``proxymode.io/action`` annotation once consumed."""

    value: str


Action = (
    SaveBackup
    | CreateObject
    | ApplyObject
    | PatchObject
    | SetNodeMode
    | CreateJob
    | DeleteObject
    | EmitEvent
    | ClearAction
)


@dataclass(frozen=True)
class Decision:
    """The engine's answer: the next status, the actions, and when to look again."""

    status: PolicyStatus
    actions: Sequence[Action] = field(default_factory=tuple)
    requeue_seconds: float = 10.0
    release_finalizer: bool = False
    """The policy is being deleted and nothing it changed is left: let it go."""
