"""``proxymode``: the product's node-side commands (today one: ``verify-node``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from proxymode.verify.node import main as verify_node


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: proxymode verify-node --mode MODE --previous MODE --service NS/NAME:PORT"
            " --address IP:PORT [--timeout S]"
        )
        return 0 if args else 2
    if args[0] == "verify-node":
        return verify_node(args[1:])
    print(f"proxymode: unknown command {args[0]!r} (known: verify-node)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
