"""The client port dpproxy bound, one for every address it listens on, and the file that tells it.

``listen.port: 0`` (or ``--port 0``) lets the kernel choose a free port. asyncio's
``start_server`` binds each address of the host on its own, so a host with several addresses
(``""``: every IPv4 and IPv6 interface) would get one port per address; ``start_on_one_port``
makes them all the same. ``PortFile`` is ``--port-file PATH``: the bound port, written once
dpproxy accepts connections there, removed when it stops accepting (docs/deployment.md,
"Port 0 and --port-file").
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Final

from .startup import port_file_failure

__all__ = ["PortFile", "PORT_ATTEMPTS", "start_on_one_port"]

log = logging.getLogger("dpproxy.bound_port")

PORT_ATTEMPTS: Final = 20
"""How many kernel-chosen ports ``start_on_one_port`` tries before it gives up: each is lost only
when another program binds it on a second address in the moment between two binds."""


async def start_on_one_port(accept: Any, host: str | None, port: int, **options: Any) -> asyncio.Server:
    """``asyncio.start_server(accept, host, port, **options)`` whose sockets all share one port.

    A port other than 0 is bound as asked (an address that cannot take it raises, as
    ``start_server`` does). Port 0: if the kernel chose different ports for the host's
    addresses, the server is closed and started again on the first address's port; if another
    program took that port on another address meanwhile, a new port is chosen, up to
    ``PORT_ATTEMPTS`` times, then OSError(EADDRINUSE) is raised.
    """
    for _ in range(PORT_ATTEMPTS):
        server = await asyncio.start_server(accept, host, port, **options)
        chosen = {sock.getsockname()[1] for sock in server.sockets}
        if port != 0 or len(chosen) == 1:
            return server
        first = server.sockets[0].getsockname()[1]
        log.debug("port 0 on %r: the kernel chose ports %s; binding every address on port %d",
                  host, sorted(chosen), first)
        server.close()
        await server.wait_closed()
        try:
            return await asyncio.start_server(accept, host, first, **options)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            log.info("port 0 on %r: port %d was taken on another address meanwhile; choosing another port",
                     host, first)
    raise OSError(errno.EADDRINUSE, f"no port was free on every address of {host!r} in {PORT_ATTEMPTS} tries")


_NAME_ATTEMPTS: Final = 100
"""How many random names ``_created_beside`` tries for the port file's temporary file."""


class PortFile:
    """``--port-file PATH``: the bound port in decimal and a newline, or no file.

    ``clear`` (at startup) removes a file left by an earlier run, so that the file exists only
    while this dpproxy accepts connections on the port it names; ``write`` puts the port there
    atomically (a reader sees the whole line or no file); ``remove`` takes it away when
    dpproxy stops accepting, if it still names the port this one wrote: a second dpproxy given
    the same path has replaced it with its own port (no two accept on one port), which must
    outlive the first one's stop. A process killed with SIGKILL leaves its file behind.
    """

    def __init__(self, path: Path):
        self.path = path
        self._line: str | None = None  # what write() put there

    def clear(self) -> None:
        """Remove a file left at the path. Raises StartupError if it cannot be removed or its
        directory does not exist: found at startup, not once dpproxy listens."""
        try:
            if not self.path.parent.is_dir():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.path.parent))
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise port_file_failure(self.path, exc) from exc

    def write(self, port: int) -> None:
        """Write ``port`` to the path at once: a temporary file beside it, renamed over it.
        The file's mode is what the process's umask makes of 0666, as for any file it
        creates (0644 under the usual 022; 0600 under a service's 077). Raises StartupError
        if it cannot be written."""
        try:
            descriptor, temporary = _created_beside(self.path)
        except OSError as exc:
            raise port_file_failure(self.path, exc) from exc
        try:
            with os.fdopen(descriptor, "w", encoding="ascii") as out:
                out.write(f"{port}\n")
            os.replace(temporary, self.path)
            self._line = f"{port}\n"
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise port_file_failure(self.path, exc) from exc

    def read(self) -> int:
        """The port the file names (``dpproxy health --port-file``). Raises OSError if it cannot
        be read (FileNotFoundError: no dpproxy accepts connections on a port it wrote), and
        ValueError, saying why, if it holds anything but a port number and a newline."""
        text = self.path.read_bytes().decode("ascii", errors="replace")
        number = text.removesuffix("\n")
        if number == text or not (number.isdecimal() and number.isascii()) or not 0 < int(number) <= 65535:
            shown = text if len(text) <= 20 else text[:20] + "…"
            raise ValueError(f"does not hold a port number and a newline (it holds {shown!r})")
        return int(number)

    def remove(self) -> None:
        """Remove the file, if it is there and names the port :meth:`write` wrote (not another
        dpproxy's, written to the same path since)."""
        try:
            if self._line is not None and self.path.read_text(encoding="ascii") == self._line:
                self.path.unlink()
        except (OSError, UnicodeDecodeError):
            pass  # stopping: the file's directory went away or became read-only; nothing to tell


def _created_beside(path: Path) -> tuple[int, Path]:
    """A new file of a name of its own in ``path``'s directory, open for writing, and its path.

    Not ``tempfile.mkstemp``: its files are 0600 whatever the umask, and a chmod after it would
    set a mode whatever the umask too; the umask is read by setting it, which races with every
    other thread's files. ``os.open``'s 0666 is what the kernel applies the umask to.
    """
    for _ in range(_NAME_ATTEMPTS):
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), temporary
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside it in {_NAME_ATTEMPTS} tries", str(path))
