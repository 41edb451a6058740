"""A backend for the sandbox's Services: answers every HTTP GET with its own name.

Runs inside a network namespace of its own on the sandbox's bridge, so a request that
reaches it went through a node's Service rules (DNAT to the backend's address).

    python -m proxymode_sandbox.echo --name echo-1 --listen 10.250.24.101:8080 --state-dir DIR
"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _handler(name: str) -> type[BaseHTTPRequestHandler]:
    body = f"{name}\n".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--state-dir", required=True, help="names the sandbox (for `down`)")
    args = p.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), _handler(args.name))
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
