"""/metrics, /healthz and /readyz on one small HTTP server, in a thread of its own: the node
agents' (device plugin, DRA driver). /healthz answers while the process runs; /readyz once
``ready()`` says the kubelet can reach it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def serve_ops(port: int, ready: Callable[[], bool], host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Starts the server and returns it; `shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
            if self.path == "/metrics":
                self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok\n")
            elif self.path == "/readyz":
                ok = ready()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
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
