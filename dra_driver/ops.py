"""/metrics and /healthz on one small HTTP server, in a thread of its own.

/healthz answers 200 while the driver serves its kubelet sockets, 503 otherwise. Registration
is only logged: a kubelet that is slow to find the socket is no reason to restart the driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def serve_ops(port: int, healthy: Callable[[], bool], host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Starts the server and returns it; ``shutdown()`` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
            if self.path == "/metrics":
                self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok = healthy()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not serving\n")
            else:
                self._reply(404, b"not found\n")

        def _reply(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="ops-http", daemon=True).start()
    return server
