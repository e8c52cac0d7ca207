"""syncd's HTTP server of published fragments: the direct path of a merge's full message.

syncd writes each merge's full message to its file of the fragment
(syncd.published_files) before it commits the merge, so the file is where islands
read it from: one GET per pull, answered from the page cache by sendfile(2), with no
copy through the interpreter and nothing on the data plane. The commit's reference
(syncd.bulk.ServedRef) names the address, the version and the grant's file; a file
that holds another version by now is answered 404 and the island reads the
reference again (syncd.globals_store).

Every request must carry the run's read token (`Authorization: Bearer ...`), made
afresh by each syncd process for each run it serves and handed to islands through
the reference, which only that run's islands and syncd may read (syncd.acl). The
server binds loopback by default; a syncd that serves islands on other hosts binds
an interface they reach (SYNCD_SERVE) and says how they reach it (SYNCD_SERVE_URL),
and with a certificate and its key (SYNCD_SERVE_CERT, SYNCD_SERVE_KEY) it speaks
HTTPS: the token and the fragments cross the network encrypted, and islands check
the certificate against their host's trusted authorities (or SSL_CERT_FILE's).
Under TLS each answer is encrypted in the process instead of sent by sendfile(2).
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from syncd.bulk import Served
from syncd.published_files import PublishedFiles

log = logging.getLogger("archipelago.published_server")
# A connection that sends or takes nothing (nor finishes its TLS handshake) this long
# is dropped: it holds a thread of the server.
IDLE_TIMEOUT_S = 60.0
_PATH = re.compile(r"^/published/(\d+)/(\d+)/(\d+)/(\d+)$")


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (SYNCD_SERVE) as a host and a port (0: any free one).

    Raises:
        ValueError: not `host:port` with a port from 0 to 65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"SYNCD_SERVE must be host:port (a port from 0 to 65535) or off, "
                         f"got {address!r}")
    return host, int(port)


class _Server(ThreadingHTTPServer):
    """A thread per request; a request that fails (a client gone, a TLS handshake
    refused) is logged, not printed as a traceback."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: tuple) -> None:
        log.info("a request from %s failed: %s", client_address[0], sys.exception())


class PublishedServer:
    """Serves the published fragments of the runs this syncd holds, from a thread.

    Args:
        checkpoint_dir: the folder whose run subfolders hold syncd's files.
        host: the interface to bind (loopback by default).
        port: the port; 0 takes a free one.
        advertise: how islands reach the server (`http://host:port`, `https://` with
            TLS); default the bound address, or this host's address when bound to
            every interface.
        tls: the certificate (chain) file and its key file: the server speaks HTTPS.

    Raises:
        OSError: the address cannot be bound, or the certificate or key not read.
        ssl.SSLError: the certificate and key do not make a pair.
    """

    def __init__(self, checkpoint_dir: str | Path, host: str = "127.0.0.1", port: int = 0,
                 advertise: str | None = None, tls: tuple[str, str] | None = None):
        self.checkpoint_dir = Path(checkpoint_dir)
        self._tokens: dict[str, str] = {}
        self._httpd = _Server((host, port), self._handler())
        if tls is not None:
            try:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(*tls)
                # The handshake on the request's thread (its first read), not in accept:
                # a client that never finishes it holds only its own thread.
                self._httpd.socket = context.wrap_socket(
                    self._httpd.socket, server_side=True, do_handshake_on_connect=False)
            except OSError:  # ssl.SSLError is one
                self._httpd.server_close()
                raise
        if advertise is None:
            # Bound to every interface: islands reach it at this host's address.
            reach = socket.gethostbyname(socket.gethostname()) if host in ("0.0.0.0", "") \
                else host
            scheme = "https" if tls else "http"
            advertise = f"{scheme}://{reach}:{self._httpd.server_address[1]}"
        self.base_url = advertise.rstrip("/")
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="published-server", daemon=True)
        self._thread.start()
        log.info("serving published fragments at %s", self.base_url)

    def serve(self, run_id: str) -> Served:
        """Serve run `run_id`'s files under a read token of its own."""
        token = self._tokens.setdefault(run_id, secrets.token_urlsafe(32))
        return Served(self.base_url, run_id, token)

    def forget(self, run_id: str) -> None:
        """Serve run `run_id` no more (another syncd took it, or it ended)."""
        self._tokens.pop(run_id, None)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _allowed(self, run_id: str, authorization: str | None) -> bool:
        token = self._tokens.get(run_id)
        return token is not None and authorization is not None and hmac.compare_digest(
            authorization.encode(), f"Bearer {token}".encode())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = IDLE_TIMEOUT_S

            def do_GET(self) -> None:
                match = _PATH.match(self.path)
                if match is None:
                    self.send_error(404, "not a published fragment")
                    return
                run_id, fragment, version, token = match.groups()
                if not server._allowed(run_id, self.headers.get("Authorization")):
                    self.send_error(403, "not this run's read token")
                    return
                files = PublishedFiles.of_run(server.checkpoint_dir, run_id)
                with files.full_file(int(fragment), int(version), int(token)) as opened:
                    if opened is None:
                        self.send_error(404, f"fragment {fragment} is not at version "
                                             f"{version} here")
                        return
                    f, size = opened
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    self.connection.sendfile(f, f.tell(), size)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        return Handler
