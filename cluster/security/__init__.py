"""Security on the network: CURVE keys, the ZAP authenticator, and socket set-up.

  keys      key material on disk: role and client key pairs, their files (0600
            secrets), creating and loading them, the allowlist of who may connect
  zap       the ZAP handler of a ZeroMQ context, admitting the allowlist's keys
  sockets   CURVE on a socket (server before bind, client before connect) and
            ``SocketSecurity``, what a role server asks at every socket it creates
  export    keys per host: what one host of the cluster holds (its roles' secrets,
            every public key, the allowlist), written to a directory to copy there

Layered keys < zap < sockets; keys < export. This package re-exports the small API the role
servers, the launcher and the command line use (role names, ``SocketSecurity``,
creating keys, the clients' keys); anything else is imported from its module.
"""

from cluster.security.keys import (
    ADMIN_CLIENT,
    SecurityError,
    create_keys,
    keys_dir,
    partition_role,
    reader_role,
    role_names,
    sequencer_role,
)
from cluster.security.sockets import SocketSecurity, client_curves

__all__ = [
    "ADMIN_CLIENT",
    "SecurityError",
    "SocketSecurity",
    "client_curves",
    "create_keys",
    "keys_dir",
    "partition_role",
    "reader_role",
    "role_names",
    "sequencer_role",
]
