"""A TCP proxy in front of an HTTP server that can hold up one ``_bulk`` request.

Either the request reaches the server, which does its work, and its client never hears back
(a test then kills the client at the worst moment for it: the documents are in, nothing
recorded that they are); or the request never reaches the server (the documents are not in,
and must not be taken for done).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self

__all__ = ["HoldingProxy"]


class HoldingProxy:
    """Forwards 127.0.0.1:``port`` to the target; see :meth:`hold_next_bulk` and :attr:`holding`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.holding = threading.Event()
        """Set once the server's answer to the held request arrived and was kept back."""
        self._hold_next = threading.Event()
        self._forward_held = True
        self._sockets: list[socket.socket] = [self._listener]

    @property
    def url(self) -> str:
        """The proxy's address, as an HTTP URL."""
        return f"http://127.0.0.1:{self.port}"

    def hold_next_bulk(self, forward: bool = True) -> None:
        """Withhold every answer on the connection of the next ``POST .../_bulk`` request.

        ``forward=False``: the request itself is not passed on either (:attr:`holding` is
        set as soon as it arrives).
        """
        self._forward_held = forward
        self._hold_next.set()

    def __enter__(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _address = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            held = threading.Event()
            threading.Thread(target=self._up, args=(client, server, held), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, held), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, held: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self._hold_next.is_set() and data.startswith(b"POST") and b"_bulk" in data[:200]:
                    self._hold_next.clear()
                    held.set()
                    if not self._forward_held:
                        self.holding.set()
                if held.is_set() and not self._forward_held:
                    continue
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, held: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if held.is_set():
                    self.holding.set()
                    continue
                client.sendall(data)
