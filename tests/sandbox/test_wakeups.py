"""The operator reacts to a person at once, not when its requeue interval runs out.

Each change (pause, resume, a stage edit, abort) is made right after the look that put
the policy in the phase it acts on; the engine then asks to look again in 30 s (a stage
baking for an hour, or paused). A reaction well inside that interval can only come from
a wake-up. The figures are printed, not asserted as a wall-clock limit: the assertion is
that the reaction did not wait for the requeue.
"""

from __future__ import annotations

import pytest

from tests.sandbox.harness import KubeProxy, Policies
from tests.sandbox.reactions import measure

pytestmark = pytest.mark.sandbox
REQUEUE_WHILE_BAKING = 30.0
"""What the engine asks for while a stage bakes or a policy is paused with nothing moving."""


def test_pause_resume_spec_edit_and_abort_wake_the_daemon(
    policies: Policies, proxy: KubeProxy
) -> None:
    reactions = measure(policies, proxy.namespace)
    print(f"reaction seconds: {reactions}")
    for what, seconds in vars(reactions).items():
        assert seconds < REQUEUE_WHILE_BAKING / 3, (
            f"{what} took {seconds:.1f}s: the daemon waited for its requeue, nothing woke it"
        )
