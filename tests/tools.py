"""External tools the tests run (promtool, prometheus), found the same way everywhere; and
``serving``, a loopback HTTP(S) server a test stands in front of or in place of Prometheus.

``make system-deps`` installs them (Debian's prometheus package), and ``make test`` runs it
first, so a missing tool is a broken setup, not a reason to skip: every test that needs one
fails, saying which tool is missing and how to install it (a skip would hide that the real
Prometheus checks did not run).
"""

from __future__ import annotations

import shutil
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


def required(name: str) -> str:
    """The path of ``name`` on PATH; fails the calling test clearly when it is not there."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH; `make system-deps` installs it (Debian's prometheus package)",
            pytrace=False,
        )
    return path


@contextmanager
def serving(
    handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None
) -> Iterator[str]:
    """``handler`` on a free loopback port (HTTPS with ``tls``), for the ``with`` block: its
    base URL. Stopped and its socket closed on the way out, also when the test fails; polled
    every 50 ms, so stopping it costs no half-second wait."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    scheme = "https" if tls is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
