"""The ZAP authenticator (RFC 27): a handler thread per ZeroMQ context that answers
each CURVE handshake of the context's server sockets from the allowlist.

Invariants:
- The authenticator admits exactly the CURVE keys on its allowlist: role keys on every
  server socket, client keys only on sockets that serve clients (``CLIENT_DOMAIN``).
  Any other mechanism (NULL, PLAIN), domain or key is refused before a message of the
  peer reaches the socket.
- One authenticator per context (ZAP's endpoint is per context).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import zmq
from zmq.utils import z85

from cluster.security.keys import AllowList, SecurityError, load_allowlist

log = logging.getLogger("ordo.security")

# ZAP domains: a server socket says which peers it serves.
CLIENT_DOMAIN = b"ordo-clients"  # role keys and allowlisted client keys
INTERNAL_DOMAIN = b"ordo-internal"  # role keys only (partition inboxes, ...)
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by ZAP (RFC 27), one per context
ZAP_VERSION = b"1.0"
ZAP_STOP_POLL_S = 0.1  # the handler thread looks at its stop flag this often
ZAP_START_WAIT_S = 10.0
ZAP_REFUSAL_LOG_EVERY_S = 1.0
USER_ROLE_PREFIX = "role:"  # the User-Id a ZAP reply gives a role's connections
USER_CLIENT_PREFIX = "client:"


_running: dict[int, Authenticator] = {}  # id(context) -> its authenticator
_running_lock = threading.Lock()


def authenticator_running(ctx: zmq.Context) -> bool:
    with _running_lock:
        return id(ctx) in _running


class Authenticator:
    """A ZAP handler (RFC 27) in a thread of the process that binds the server sockets.

    One per context (ZAP's endpoint is per context). ``admitted`` and ``refused`` count
    its answers; refusals are logged at most once a second with the latest reason."""

    def __init__(self, ctx: zmq.Context, allowlist: AllowList) -> None:
        self.ctx = ctx
        self._allowlist = allowlist
        self.admitted = 0
        self.refused = 0
        self._latest_refusal = ""
        self._refused_logged = 0
        self._next_log_at = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: zmq.ZMQError | None = None
        self._thread = threading.Thread(target=self._run, name="ordo-zap", daemon=True)

    @property
    def allowlist(self) -> AllowList:
        return self._allowlist

    def replace_allowlist(self, allowlist: AllowList) -> None:
        """Admit this allowlist from now on (connections already made stay)."""
        self._allowlist = allowlist

    def start(self) -> None:
        with _running_lock:
            if id(self.ctx) in _running:
                raise SecurityError("an authenticator already runs in this ZeroMQ context")
            _running[id(self.ctx)] = self
        self._thread.start()
        if not self._ready.wait(ZAP_START_WAIT_S) or self._error is not None:
            self.stop()
            raise SecurityError(f"the ZAP handler did not start: {self._error}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with _running_lock:
            if _running.get(id(self.ctx)) is self:
                del _running[id(self.ctx)]

    def __enter__(self) -> Authenticator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        sock = self.ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        bound = False
        try:
            try:
                sock.bind(ZAP_ENDPOINT)
                bound = True
            except zmq.ZMQError as e:  # another handler holds this context's endpoint
                self._error = e
                return
            finally:
                self._ready.set()
            while not self._stop.is_set():
                if sock.poll(int(ZAP_STOP_POLL_S * 1000)):
                    sock.send_multipart(self.answer(sock.recv_multipart()))
        finally:
            if bound:  # an inproc unbind frees the name now; close frees it later
                sock.unbind(ZAP_ENDPOINT)  # (ZeroMQ's reaper thread): stop() frees it
            sock.close()

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply to one request (RFC 27): 200 with the peer's User-Id, or 400."""
        request_id = request[1] if len(request) > 1 else b""
        user, reason = self._decide(request)
        if user is None:
            self.refused += 1
            address = request[3].decode(errors="replace") if len(request) > 3 else "?"
            self._latest_refusal = f"{reason} (from {address})"
            self._log_refusals(time.monotonic())
            return [ZAP_VERSION, request_id, b"400", reason.encode(), b"", b""]
        self.admitted += 1
        return [ZAP_VERSION, request_id, b"200", b"OK", user.encode(), b""]

    def _log_refusals(self, now: float) -> None:
        # A flood of refused connections must not flood the log: one line a second.
        if now < self._next_log_at:
            return
        log.warning(
            "ZAP refused %d connection(s) since the last report (%d in all), latest: %s",
            self.refused - self._refused_logged,
            self.refused,
            self._latest_refusal,
        )
        self._refused_logged = self.refused
        self._next_log_at = now + ZAP_REFUSAL_LOG_EVERY_S

    def _decide(self, request: list[bytes]) -> tuple[str | None, str]:
        if len(request) < 6 or request[0] != ZAP_VERSION:
            return None, "malformed ZAP request"
        domain, mechanism, credentials = request[2], request[5], request[6:]
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            return None, f"mechanism {mechanism.decode(errors='replace')} not admitted"
        key = z85.encode(credentials[0])
        allow = self._allowlist
        if key in allow.roles:
            if domain in (CLIENT_DOMAIN, INTERNAL_DOMAIN):
                return USER_ROLE_PREFIX + allow.roles[key], ""
            return None, "unknown ZAP domain"
        if key in allow.clients:
            if domain == CLIENT_DOMAIN:
                return USER_CLIENT_PREFIX + allow.clients[key], ""
            return None, f"client {allow.clients[key]} not admitted on a cluster-internal socket"
        return None, "unknown key"


def start_authenticator(
    ctx: zmq.Context, allowed: AllowList | str | Path, roles: Sequence[str] = ()
) -> Authenticator:
    """Start the ZAP handler of ``ctx``: before any server socket of ``ctx`` binds.

    ``allowed`` is an AllowList, or a data dir whose allowlist (keys of ``roles`` and
    ``keys/clients/*.key``) is loaded. The caller stops the handle (``stop()``)."""
    allowlist = allowed if isinstance(allowed, AllowList) else load_allowlist(allowed, roles)
    auth = Authenticator(ctx, allowlist)
    auth.start()
    return auth
