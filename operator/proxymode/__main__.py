"""``python -m proxymode`` / ``proxymode-operator``: run the operator.

    proxymode-operator [--kubeconfig PATH] [--liveness URL] [--metrics-address HOST:PORT]
                       [--peering NAME] [--verbose]

In a pod it uses its ServiceAccount; elsewhere ``--kubeconfig`` or ``$KUBECONFIG``. Without
``--peering`` it runs standalone (one replica; the chart's Deployment uses ``Recreate``).
"""

from __future__ import annotations

import argparse
import os
import sys


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
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.kubeconfig:
        # Before the kubernetes client is imported: it reads $KUBECONFIG once, at import.
        os.environ["KUBECONFIG"] = args.kubeconfig
    import kopf  # noqa: PLC0415 - after $KUBECONFIG is set, see above

    import proxymode.handlers  # noqa: PLC0415 - importing registers the handlers

    if args.metrics_address:
        proxymode.handlers.telemetry.serve(args.metrics_address)
    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=True,
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
