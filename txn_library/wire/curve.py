"""A client's CURVE credentials: what ``txn_library.client.Client`` needs to talk to one
server of a cluster that runs CURVE (cluster/security/ loads them from a data dir).

Plain bytes, no sockets: the client sets them on its DEALER before it connects
(CURVE_SERVERKEY = server_public, CURVE_PUBLICKEY = client_public, CURVE_SECRETKEY =
client_secret).

Invariant: every key is a Z85-encoded 32-byte Curve25519 key (40 characters); the
secret never appears in a repr (it would leak into logs and tracebacks).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

Z85_KEY_CHARS = 40  # a 32-byte key in Z85 (zmq's text form of CURVE keys)
_Z85 = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


def is_z85_key(key: bytes) -> bool:
    """True when ``key`` is a CURVE key in zmq's text form: 40 Z85 characters."""
    return isinstance(key, bytes) and len(key) == Z85_KEY_CHARS and set(key) <= _Z85


@dataclass(frozen=True)
class ClientCurve:
    """One client's key pair and the public key of the server it connects to."""

    client_public: bytes
    client_secret: bytes = field(repr=False)
    server_public: bytes

    def __post_init__(self) -> None:
        for name in ("client_public", "client_secret", "server_public"):
            if not is_z85_key(getattr(self, name)):
                raise ValueError(f"{name} is not a Z85-encoded CURVE key (40 characters)")

    def to_server(self, server_public: bytes) -> ClientCurve:
        """The same client key pair, talking to another server (another sequencer)."""
        return replace(self, server_public=server_public)
