"""``kubectl proxymode``: the entry point, the shared flags and the output formats.

kubectl runs any ``kubectl-proxymode`` on PATH as ``kubectl proxymode`` and passes it none of
its own flags, so the plugin takes the standard ones itself (``--kubeconfig``, ``--context``,
``-o json|yaml``), before or after the command, as kubectl does.

Exit codes (for CI scripts, see ``status --timeout``): 0 done / Completed, 1 an error (the API
refused, no such policy, bad input), 2 bad usage, 3 RolledBack, 4 Failed, 5 timed out.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

import urllib3
from kubernetes.client.exceptions import ApiException

from proxymode.cli import actions, advise, common, plan, report, status
from proxymode.cli.client import ClientError
from proxymode.cli.tree import EXIT_ERROR

Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=common.PROG,
        description="kubectl proxymode: drive and inspect ProxyModePolicy rollouts of kube-proxy"
        " between iptables, ipvs and nftables.",
        epilog="exit codes: 0 ok/Completed, 1 error, 2 usage, 3 RolledBack, 4 Failed, 5 timeout",
    )
    common.add_flags(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (status, actions, plan, advise, report):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # urllib3 logs each retry of a refused connection as a WARNING; the error below says it once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    try:
        code = _run(args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below, not at exit
    except BrokenPipeError:
        # `kubectl proxymode list | head`: the reader left. Say nothing more (as kubectl
        # does), and keep Python from complaining when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    return code


def _run(args: argparse.Namespace) -> int:
    func: Command = args.func
    try:
        return func(args)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except urllib3.exceptions.HTTPError as e:
        reason = getattr(e, "reason", None) or e
        print(f"error: cannot reach the API server: {reason}", file=sys.stderr)
        return EXIT_ERROR
    except ApiException as e:
        print(f"error: the API server refused: {e.status} {e.reason}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
