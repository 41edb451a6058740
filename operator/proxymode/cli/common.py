"""Helpers every command shares: the standard flags, durations and the output formats."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import yaml

from proxymode.cli.client import Connection

PROG = "kubectl proxymode"
OUTPUTS = ("text", "json", "yaml")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h30m``: seconds, as kubectl's ``--timeout`` reads them."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 5m, 1h30m)")
    return sum(float(n) * _UNIT[u] for n, u in parts)


def connection(args: argparse.Namespace) -> Connection:
    return Connection(kubeconfig=args.kubeconfig, context=args.context)


def emit(data: Any, fmt: str) -> None:
    """Print ``data`` as JSON or YAML (text views print themselves)."""
    if fmt == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        print(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False), end="")


def add_flags(parser: argparse.ArgumentParser, default: Any, output: bool = True) -> None:
    parser.add_argument(
        "--kubeconfig", default=default, help="path to the kubeconfig (default: $KUBECONFIG)"
    )
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    if output:
        parser.add_argument(
            "-o",
            "--output",
            choices=OUTPUTS,
            default="text" if default is None else default,
            help="output format (default: text)",
        )


def common_flags(output: bool = True) -> argparse.ArgumentParser:
    """The shared flags for a subcommand; SUPPRESS so that they do not hide the top level's."""
    parent = argparse.ArgumentParser(add_help=False)
    add_flags(parent, argparse.SUPPRESS, output)
    return parent
