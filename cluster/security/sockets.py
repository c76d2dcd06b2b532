"""CURVE on a role server's sockets: server and client set-up before bind or connect,
what a client needs to reach the sequencers, and ``SocketSecurity``, the one object a
role server asks at every socket it creates.

A cluster whose config says ``curve`` runs every ZeroMQ socket with CURVE: traffic is
encrypted, a client knows it talks to the server whose public key it holds, and the
server's ZAP handler admits only the keys it knows. The loopback embedded default runs
without CURVE (``SocketSecurity.off``: every call a no-op).

Invariants:
- A CURVE server socket enforces ZAP (ZAP_ENFORCE_DOMAIN): with no authenticator in
  its context it admits nobody, so a missing handler fails closed, never open.
- Security options are set before the socket's first bind or connect (set later,
  they would leave the earlier endpoint in plain text).
- CURVE is on or off for a role wholly: its key pair and its allowlist together.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import zmq

from cluster.config import ClusterConfig
from cluster.security.keys import (
    AllowList,
    CurveIdentity,
    SecurityError,
    load_allowlist,
    load_client_identity,
    load_identity,
    load_role_public,
    role_names,
    role_public_path,
    role_secret_path,
    sequencer_role,
)
from cluster.security.zap import (
    CLIENT_DOMAIN,
    INTERNAL_DOMAIN,
    Authenticator,
    authenticator_running,
    start_authenticator,
)
from txn_library.errors import invariant
from txn_library.wire.curve import ClientCurve, is_z85_key


def _before_endpoints(sock: zmq.Socket, what: str) -> None:
    # Options apply to the binds and connects made after them: set late, they would
    # leave the earlier endpoint in plain text.
    if sock.getsockopt(zmq.LAST_ENDPOINT):
        raise SecurityError(f"{what} must be called before the socket binds or connects")


def secure_server(sock: zmq.Socket, identity: CurveIdentity, *, admit_clients: bool = True) -> None:
    """Make ``sock`` a CURVE server with ``identity``, admitting what the authenticator of
    its context admits: roles, and clients too when ``admit_clients``. Before bind."""
    _before_endpoints(sock, "secure_server")
    if not authenticator_running(sock.context):
        raise SecurityError(
            "no authenticator runs in this socket's context: call start_authenticator "
            "first (without one a CURVE server admits nobody)"
        )
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, identity.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, identity.public)
    sock.setsockopt(zmq.ZAP_DOMAIN, CLIENT_DOMAIN if admit_clients else INTERNAL_DOMAIN)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def secure_client(sock: zmq.Socket, identity: CurveIdentity, server_public: bytes) -> None:
    """Make ``sock`` a CURVE client of the server holding ``server_public``. Before connect."""
    _before_endpoints(sock, "secure_client")
    if not is_z85_key(server_public):
        raise SecurityError("server_public is not a Z85 CURVE public key")
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, identity.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, identity.secret)


def client_curve(
    data_dir: str | Path, client: str, server_role: str = sequencer_role(0)
) -> ClientCurve:
    """What txn_library.client.Client needs to reach ``server_role`` as ``client``."""
    ident = load_client_identity(data_dir, client)
    return ClientCurve(ident.public, ident.secret, load_role_public(data_dir, server_role))


def client_curves(
    config: ClusterConfig, client: str, data_dir: str | Path | None = None
) -> list[ClientCurve]:
    """One ClientCurve per sequencer, in the order of ``config.client_addrs``."""
    root = config.data_dir if data_dir is None else data_dir
    one = client_curve(root, client)
    seq = [r for r in role_names(config) if r.startswith("sequencer-")]
    return [one.to_server(load_role_public(root, r)) for r in seq]


class _NoAuthenticator:
    def stop(self) -> None:
        pass


class SocketSecurity:
    """What a role server needs at every socket it creates: its own key pair, every
    server role's public key, and the allowlist. ``off()``: every method a no-op (the
    loopback default without CURVE).

        sec = SocketSecurity.for_role(config, "r0p1")
        auth = sec.start(ctx)              # before binding; auth.stop() at exit
        sec.server(inbox, clients=False)   # before inbox.bind(...)
        sec.client(sub, "sequencer-0")     # before sub.connect(...)
    """

    def __init__(
        self,
        identity: CurveIdentity | None,
        servers: Mapping[str, bytes],
        allowlist: AllowList | None,
    ) -> None:
        invariant((identity is None) == (allowlist is None), "CURVE is on or off, wholly")
        self.identity = identity
        self.servers = servers
        self.allowlist = allowlist

    @classmethod
    def off(cls) -> SocketSecurity:
        return cls(None, {}, None)

    @classmethod
    def for_role(
        cls, config: ClusterConfig, role: str, data_dir: str | Path | None = None
    ) -> SocketSecurity:
        """``role``'s security in ``config``'s cluster: off unless ``config.curve``;
        when on, every key it needs must load (SecurityError names what is wrong)."""
        if not getattr(config, "curve", False):
            return cls.off()
        root = config.data_dir if data_dir is None else data_dir
        roles = role_names(config)
        if role not in roles:
            raise SecurityError(f"{role!r} is not a role of this cluster ({', '.join(roles)})")
        servers = {r: load_role_public(root, r) for r in roles}
        ident = load_identity(root, role)
        if servers[role] != ident.public:
            raise SecurityError(
                f"{role_public_path(root, role)} is not the public key of "
                f"{role_secret_path(root, role)}"
            )
        return cls(ident, MappingProxyType(servers), load_allowlist(root, roles))

    @property
    def enabled(self) -> bool:
        return self.identity is not None

    def start(self, ctx: zmq.Context) -> Authenticator | _NoAuthenticator:
        """Start this process's ZAP handler in ``ctx`` (a no-op handle when off)."""
        if self.allowlist is None:
            return _NoAuthenticator()
        return start_authenticator(ctx, self.allowlist)

    def server(self, sock: zmq.Socket, *, clients: bool) -> None:
        """Before bind. ``clients``: whether allowlisted clients may connect here too."""
        if self.identity is not None:
            secure_server(sock, self.identity, admit_clients=clients)

    def client(self, sock: zmq.Socket, server_role: str) -> None:
        """Before connect, to a socket that ``server_role`` binds."""
        if self.identity is None:
            return
        if server_role not in self.servers:
            raise SecurityError(f"no public key of {server_role!r} (not a role of this cluster)")
        secure_client(sock, self.identity, self.servers[server_role])
