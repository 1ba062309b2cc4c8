"""Port 0 bound to one port on every address of the host, and ``--port-file``'s file."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
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


def test_a_port_taken_on_the_second_address_meanwhile_is_given_up_for_another(monkeypatch: pytest.MonkeyPatch,
                                                                              caplog: pytest.LogCaptureFixture):
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
        with caplog.at_level(logging.DEBUG):
            ports = asyncio.run(bound())
        taken = blockers[0].getsockname()[1]
    finally:
        for blocker in blockers:
            blocker.close()
    assert len(ports) == 1 and taken not in ports
    # The retry is told in dpproxy's own words (it was told by nothing): the port given up, at INFO.
    retries = [record for record in caplog.records if record.name == "dpproxy.bound_port"]
    assert [(record.levelno, f"port {taken} was taken on another address meanwhile" in record.getMessage())
            for record in retries if record.levelno >= logging.INFO] == [(logging.INFO, True)], retries
    assert not [record for record in caplog.records if record.name == "asyncio" and record.levelno >= logging.INFO]


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


def test_the_port_file_holds_the_port_and_a_newline(tmp_path: Path):
    port_file = PortFile(tmp_path / "dpproxy.port")
    (tmp_path / "dpproxy.port").write_text("6432\n")  # an earlier run's
    port_file.clear()
    assert not port_file.path.exists()
    port_file.write(54321)
    assert port_file.path.read_text() == "54321\n"
    assert port_file.read() == 54321
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dpproxy.port"]
    port_file.remove()
    port_file.remove()  # twice: stopping never fails on it
    assert not port_file.path.exists()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_port_file_has_the_mode_the_umask_gives_a_new_file(tmp_path: Path, umask: int, mode: int):
    # It was 0644 whatever the umask: a service run with UMask=0077 had a file others could read.
    # The umask is the process's, shared by the proxies this test process runs: set in a child.
    path = tmp_path / "dpproxy.port"
    script = ("import os, sys; from pathlib import Path; from proxy.serving.bound_port import PortFile; "
              f"os.umask({umask}); PortFile(Path(sys.argv[1])).write(54321)")
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=60)
    assert path.read_text() == "54321\n"
    assert os.stat(path).st_mode & 0o777 == mode
    assert [entry.name for entry in tmp_path.iterdir()] == ["dpproxy.port"]  # no temporary left


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
