"""A TCP relay in front of a Redis whose target can change, as a Kubernetes Service or a
DNS name does after a failover: new connections go to the current target, open ones stay
where they were."""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Listens on ``port`` and relays each connection to the target of the moment."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        threading.Thread(target=self._accept, name="tcp-relay", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._server.accept()
            except OSError:  # closed
                return
            far = socket.create_connection(("127.0.0.1", self.target_port))
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._server.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):  # the other pump shut it already
                end.shutdown(socket.SHUT_RDWR)
