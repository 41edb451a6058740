"""A TCP forwarder: the API server, reachable from the real nodes' namespaces.

kube-apiserver binds 127.0.0.1 only (nothing of the sandbox listens on the machine's
other addresses), and a namespace's 127.0.0.1 is its own. This process listens on the
host side of the sandbox's bridge and relays each connection, bytes unchanged, to the
API server on loopback; TLS stays end to end (the node kubeconfig names a SAN of the
serving certificate in ``tls-server-name``).

    python -m proxymode_sandbox.forward --listen 10.250.24.1:6443 --to 127.0.0.1:PORT \
        --state-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--listen", required=True, type=_addr)
    p.add_argument("--to", required=True, type=_addr)
    p.add_argument("--state-dir", required=True, help="names the sandbox (for `down`)")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, args.to))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
