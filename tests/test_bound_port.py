"""Port 0 bound to one port on every address of the host, and ``--port-file``'s file."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from proxy.serving import bound_port
from proxy.serving.bound_port import PortFile, start_on_one_port
from proxy.serving.startup import StartupError


async def _nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


def _ports(server: asyncio.Server) -> set[int]:
    return {sock.getsockname()[1] for sock in server.sockets}


def test_port_0_on_every_address_is_one_port():
    async def bound() -> tuple[int, set[int]]:
        server = await start_on_one_port(_nothing, "", 0)
        try:
            return len(server.sockets), _ports(server)
        finally:
            server.close()
            await server.wait_closed()

    sockets, ports = asyncio.run(bound())
    assert sockets == 2 and len(ports) == 1 and 0 not in ports  # 0.0.0.0 and ::, one port


def test_a_port_taken_on_the_second_address_meanwhile_is_given_up_for_another(monkeypatch: pytest.MonkeyPatch):
    # Another program takes the first address's port on the other address between the two binds
    # (a real socket, placed at that moment by wrapping asyncio's start_server): a fresh port
    # is chosen.
    real = asyncio.start_server
    blockers: list[socket.socket] = []

    async def start_server(*args: Any, **kwargs: Any) -> asyncio.Server:
        server = await real(*args, **kwargs)
        if not blockers and args[2] == 0:
            # The port start_on_one_port will try on every address, taken on the other family.
            first = server.sockets[0]
            family, wildcard = ((socket.AF_INET, "0.0.0.0") if first.family == socket.AF_INET6
                                else (socket.AF_INET6, "::"))
            blocker = socket.socket(family)
            if family == socket.AF_INET6:
                blocker.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            blocker.bind((wildcard, first.getsockname()[1]))
            blocker.listen()  # asyncio binds with SO_REUSEADDR, which only a listening socket stops
            blockers.append(blocker)
        return server

    monkeypatch.setattr(bound_port.asyncio, "start_server", start_server)

    async def bound() -> set[int]:
        server = await start_on_one_port(_nothing, "", 0)
        try:
            return _ports(server)
        finally:
            server.close()
            await server.wait_closed()

    try:
        ports = asyncio.run(bound())
        taken = blockers[0].getsockname()[1]
    finally:
        for blocker in blockers:
            blocker.close()
    assert len(ports) == 1 and taken not in ports


def test_a_port_other_than_0_is_bound_as_asked():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def bound() -> set[int]:
        server = await start_on_one_port(_nothing, "127.0.0.1", port)
        try:
            return _ports(server)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(bound()) == {port}


def test_the_port_file_holds_the_port_and_a_newline_readable_by_others(tmp_path: Path):
    port_file = PortFile(tmp_path / "dpproxy.port")
    (tmp_path / "dpproxy.port").write_text("6432\n")  # an earlier run's
    port_file.clear()
    assert not port_file.path.exists()
    port_file.write(54321)
    assert port_file.path.read_text() == "54321\n"
    assert os.stat(port_file.path).st_mode & 0o777 == 0o644
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dpproxy.port"]
    port_file.remove()
    port_file.remove()  # twice: stopping never fails on it
    assert not port_file.path.exists()


def test_a_port_file_that_cannot_be_written_is_a_startup_error(tmp_path: Path):
    with pytest.raises(StartupError, match="cannot write the port file .*: no such file or directory"):
        PortFile(tmp_path / "missing" / "dpproxy.port").clear()
    (tmp_path / "directory").mkdir()
    with pytest.raises(StartupError, match="cannot write the port file .*: is a directory"):
        PortFile(tmp_path / "directory").clear()


def test_a_second_dpproxy_on_the_same_port_file_keeps_its_port_there_when_the_first_stops(tmp_path: Path):
    path = tmp_path / "dpproxy.port"
    first, second = PortFile(path), PortFile(path)
    first.clear()
    first.write(6001)
    second.clear()  # a second dpproxy started with the same --port-file
    second.write(6002)
    first.remove()  # the first one stops: the file names the second's port, still accepting
    assert path.read_text() == "6002\n"
    second.remove()
    assert not path.exists()
    third = PortFile(path)
    third.write(6003)
    PortFile(path).remove()  # one that never wrote the file leaves it
    assert path.read_text() == "6003\n"
