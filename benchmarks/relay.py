"""A do-nothing asyncio proxy: copies bytes between each client and PostgreSQL.

    python -m benchmarks.relay LISTEN_PORT BACKEND_HOST BACKEND_PORT

BACKEND_HOST is an address or a unix socket directory (as libpq's ``host``). The benchmark
runs it next to dpproxy: what the relay costs over direct PostgreSQL is the floor of any
proxy built on asyncio streams in one Python process, before it parses a single message.
"""

from __future__ import annotations

import asyncio
import sys

_CHUNK = 1 << 16


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(listen_port: int, host: str, port: int) -> None:
    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if host.startswith("/"):
            backend = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            backend = await asyncio.open_connection(host, port)
        backend_reader, backend_writer = backend
        await asyncio.gather(_pump(client_reader, backend_writer), _pump(backend_reader, client_writer))

    server = await asyncio.start_server(relay, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    listen_port, host, port = int(argv[0]), argv[1], int(argv[2])
    try:
        asyncio.run(_serve(listen_port, host, port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
