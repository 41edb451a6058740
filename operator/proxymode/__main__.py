"""``python -m proxymode`` / ``proxymode-operator``: run the operator.

    proxymode-operator [--kubeconfig PATH] [--liveness URL] [--metrics-address HOST:PORT]
                       [--peering NAME [--priority N] [--peering-lifetime SECONDS]] [--verbose]

In a pod it uses its ServiceAccount; elsewhere ``--kubeconfig`` or ``$KUBECONFIG``. Without
``--peering`` it runs standalone (one replica). With ``--peering`` several replicas run and
exactly one acts (kopf peering, decision 0071): each replica's priority is its seniority,
so the one started first acts and the others stand by; when it stops, or its keep-alive is
older than its lifetime (a crash), the next oldest takes over.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

PRIORITY_EPOCH_MS = 10**13
"""Seniority priorities count down from here (milliseconds since 1970; year 2286)."""


def seniority(started: float, tie_break: int | None = None) -> int:
    """A peering priority that is higher the earlier the operator started.

    kopf pauses an operator while a live peer has a higher or equal priority (equal: all
    of them pause), so replicas need distinct priorities. Counting down from the start
    time keeps the acting replica acting when a replacement starts (a new pod is always
    junior), and a random last two digits part two replicas started in the same
    millisecond. The value stays below 2**53, exact in the JSON the API server keeps.
    """
    rank = PRIORITY_EPOCH_MS - int(started * 1000)
    return rank * 100 + (random.randrange(100) if tie_break is None else tie_break)  # noqa: S311


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="proxymode-operator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", help="kubeconfig to use outside a cluster")
    parser.add_argument(
        "--liveness",
        default=None,
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-address",
        default=None,
        help="serve the operator's Prometheus metrics on /metrics, e.g. 0.0.0.0:8000",
    )
    parser.add_argument(
        "--peering", default=None, help="kopf peering object name for active/standby replicas"
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority (default: seniority, the first replica started acts)",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=int,
        default=60,
        help="seconds a replica's keep-alive counts; a crashed one is replaced after this",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    started = time.time()
    if args.kubeconfig:
        # Before the kubernetes client is imported: it reads $KUBECONFIG once, at import.
        os.environ["KUBECONFIG"] = args.kubeconfig
    import kopf  # noqa: PLC0415 - after $KUBECONFIG is set, see above

    import proxymode.handlers  # noqa: PLC0415 - importing registers the handlers

    if args.metrics_address:
        proxymode.handlers.telemetry.serve(args.metrics_address)
    kopf.configure(verbose=args.verbose)
    if args.peering is not None:
        from proxymode.kube.peering import PeeringUnavailableError  # noqa: PLC0415 - as above

        try:
            proxymode.handlers.ensure_peering(args.peering)
        except PeeringUnavailableError as e:
            print(f"proxymode-operator: {e}", file=sys.stderr)
            return 1
    settings = kopf.OperatorSettings()
    settings.peering.lifetime = max(2, args.peering_lifetime)
    settings.peering.stealth = True  # a keep-alive every few seconds is not news
    kopf.run(
        clusterwide=True,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else seniority(started),
        settings=settings,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
