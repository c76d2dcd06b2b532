"""Security on the network: CURVE keys, the ZAP authenticator, and socket set-up.

A cluster whose config says ``curve`` runs every ZeroMQ socket with CURVE: traffic is
encrypted, a client knows it talks to the server whose public key it holds, and the
server's ZAP handler admits only the keys it knows. The loopback embedded default runs
without CURVE (``SocketSecurity.off``: every call a no-op).

Key material lives in ``<data_dir>/keys/`` (zmq certificate format, readable by
``zmq.auth.load_certificate``):

  keys/                     0700
    <role>.key              public key of a role (sequencer-0, r0p1, ...)
    <role>.key_secret       its secret key, 0600
    clients/                0700, the allowlist: <client>.key, one public key per client
    client-secrets/         0700, <client>.key_secret made by ``ordo keys --client``

On a multi-host cluster a host needs its own roles' secrets, every role's public key
and the allowlist; a client needs its own secret and the sequencers' public keys.

Invariants:
- A secret key file is created with mode 0600 from the start (os.open, O_EXCL) in a
  0700 directory, and is never overwritten: creating keys again adds what is missing.
- A secret key file readable or writable by group or others is refused on load, as
  ssh refuses such keys; so is a key directory that group or others can write.
- A CURVE server socket enforces ZAP (ZAP_ENFORCE_DOMAIN): with no authenticator in
  its context it admits nobody, so a missing handler fails closed, never open.
- The authenticator admits exactly the CURVE keys on its allowlist: role keys on every
  server socket, client keys only on sockets that serve clients (``CLIENT_DOMAIN``).
  Any other mechanism (NULL, PLAIN), domain or key is refused before a message of the
  peer reaches the socket.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import zmq
from zmq.utils import z85

from cluster.config import ClusterConfig
from txn_library import limits
from txn_library.curve import ClientCurve, is_z85_key
from txn_library.errors import OrdoError, invariant

log = logging.getLogger("ordo.security")

KEYS_DIR = "keys"
CLIENTS_DIR = "clients"  # the allowlist of client public keys
CLIENT_SECRETS_DIR = "client-secrets"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
# The client key ``ordo keys`` always makes: the command line's own calls (status, call).
ADMIN_CLIENT = "admin"

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

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class SecurityError(OrdoError):
    """Key material is missing, malformed or unsafe, or a socket cannot be secured."""


# Roles ---------------------------------------------------------------------------


def sequencer_role(member: int) -> str:
    return f"sequencer-{member}"


def partition_role(replica: int, partition: int) -> str:
    return f"r{replica}p{partition}"


def role_names(config: ClusterConfig) -> list[str]:
    """Every identity of the cluster that holds a key pair: each sequencer, then each
    partition of each replica."""
    seq: Any = getattr(config, "sequencers", 1)
    count = seq if isinstance(seq, int) else len(seq)
    return [sequencer_role(i) for i in range(count)] + [
        partition_role(r, p) for r in range(config.replicas) for p in range(config.partitions)
    ]


def check_name(name: str) -> str:
    """``name`` if it can name a key file: letters, digits, _ . - (not first), bounded."""
    if not (
        0 < len(name) <= limits.curve_key_name_chars_max
        and set(name) <= _NAME_CHARS
        and name[0] not in "._-"
    ):
        raise SecurityError(
            f"{name!r} cannot name a key: use up to {limits.curve_key_name_chars_max} "
            f"letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


# Paths -----------------------------------------------------------------------------


def keys_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / KEYS_DIR


def role_public_path(data_dir: str | Path, role: str) -> Path:
    return keys_dir(data_dir) / f"{check_name(role)}{PUBLIC_SUFFIX}"


def role_secret_path(data_dir: str | Path, role: str) -> Path:
    return keys_dir(data_dir) / f"{check_name(role)}{SECRET_SUFFIX}"


def client_public_path(data_dir: str | Path, client: str) -> Path:
    return keys_dir(data_dir) / CLIENTS_DIR / f"{check_name(client)}{PUBLIC_SUFFIX}"


def client_secret_path(data_dir: str | Path, client: str) -> Path:
    return keys_dir(data_dir) / CLIENT_SECRETS_DIR / f"{check_name(client)}{SECRET_SUFFIX}"


# Key values and files ------------------------------------------------------------


@dataclass(frozen=True)
class CurveIdentity:
    """One identity's key pair, Z85-encoded (zmq's text form; 40 bytes each)."""

    name: str
    public: bytes
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        invariant(is_z85_key(self.public) and is_z85_key(self.secret), "CURVE keys are Z85")

    @classmethod
    def generate(cls, name: str) -> CurveIdentity:
        public, secret = zmq.curve_keypair()
        return cls(name, public, secret)


def _cert_text(name: str, public: bytes, secret: bytes | None) -> bytes:
    """A zmq (czmq zcert) certificate: what zmq.auth.load_certificate reads."""
    kind = (
        "**Secret** Certificate (keep it 0600; never share it)" if secret else "Public Certificate"
    )
    lines = [
        f"#   ZeroMQ CURVE {kind}",
        "#   Made by `ordo keys`",
        "",
        "metadata",
        f'    name = "{name}"',
        "curve",
        f'    public-key = "{public.decode()}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return ("\n".join(lines) + "\n").encode()


def _read_key_file(path: Path, secret: bool) -> bytes:
    """The bytes of a key file; a secret one only if group and others cannot touch it.

    The mode is checked on the open descriptor (no window between check and read)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SecurityError(f"{path}: no such key file (create keys with `ordo keys`)") from None
    except OSError as e:
        raise SecurityError(f"{path}: cannot open key file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecurityError(f"{path}: not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if secret and mode & 0o077:
            raise SecurityError(
                f"{path}: secret key file has mode {mode:04o}, open to group or others; "
                f"refusing to use it (like ssh). If nobody else could have read it, run "
                f"`chmod 600 {path}`; otherwise make new keys"
            )
        data = os.read(fd, limits.curve_key_file_bytes_max + 1)
    finally:
        os.close(fd)
    if len(data) > limits.curve_key_file_bytes_max:
        raise SecurityError(
            f"{path}: larger than {limits.curve_key_file_bytes_max} bytes, not a key file"
        )
    return data


def _key_value(path: Path, text: bytes, field_name: bytes) -> bytes | None:
    """The Z85 key of ``field_name`` (public-key, secret-key) in a certificate, if any."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(b"#") or not line.startswith(field_name):
            continue
        name, sep, value = line.partition(b"=")
        if not sep or name.strip() != field_name:
            continue
        key = value.strip(b" \t'\"")
        if not is_z85_key(key):
            raise SecurityError(
                f"{path}: {field_name.decode()} is not a 32-byte CURVE key in Z85 "
                f"({len(key)} characters, want 40)"
            )
        return key
    return None


def load_public_key(path: Path) -> bytes:
    """The public key of a public key file. A file that also holds a secret key is
    refused: public key files are copied and shared, a secret must not travel with them."""
    text = _read_key_file(path, secret=False)
    if _key_value(path, text, b"secret-key") is not None:
        raise SecurityError(
            f"{path}: a public key file holding a secret key; keep secrets in "
            f"*{SECRET_SUFFIX} files (0600) and out of the allowlist"
        )
    public = _key_value(path, text, b"public-key")
    if public is None:
        raise SecurityError(f"{path}: no public-key in this key file")
    return public


def load_secret_file(path: Path, name: str) -> CurveIdentity:
    """The key pair in a secret key file (which holds the public key too)."""
    text = _read_key_file(path, secret=True)
    secret = _key_value(path, text, b"secret-key")
    public = _key_value(path, text, b"public-key")
    if secret is None or public is None:
        raise SecurityError(f"{path}: a secret key file needs public-key and secret-key")
    if zmq.curve_public(secret) != public:
        raise SecurityError(f"{path}: public-key is not the public key of secret-key")
    return CurveIdentity(name, public, secret)


def load_identity(data_dir: str | Path, role: str) -> CurveIdentity:
    """A role's key pair, from ``keys/<role>.key_secret``."""
    return load_secret_file(role_secret_path(data_dir, role), role)


def load_client_identity(data_dir: str | Path, client: str) -> CurveIdentity:
    """A client's key pair, from ``keys/client-secrets/<client>.key_secret``."""
    return load_secret_file(client_secret_path(data_dir, client), client)


def load_role_public(data_dir: str | Path, role: str) -> bytes:
    return load_public_key(role_public_path(data_dir, role))


# Creating keys -----------------------------------------------------------------------


@dataclass
class KeysCreated:
    """What ``create_keys`` wrote, and what was there already (and so left alone)."""

    created: list[Path] = field(default_factory=list)
    existing: list[Path] = field(default_factory=list)


def _private_dir(path: Path) -> None:
    """Make ``path`` 0700 if it is missing; refuse one that group or others can write."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
        return
    _check_dir(path)


def _check_dir(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SecurityError(
            f"{path}: no such key directory (create keys with `ordo keys`)"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise SecurityError(f"{path}: not a directory")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise SecurityError(
            f"{path}: key directory has mode {mode:04o}, writable by group or others "
            f"(anyone could add a key); run `chmod 700 {path}`"
        )


def _write_new(path: Path, data: bytes, mode: int) -> bool:
    """Write ``path`` with ``mode`` from its creation, atomically, never replacing a file
    that exists. False when one does (another ``ordo keys`` won the race)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # unlike rename, fails instead of replacing
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True


def _create_pair(name: str, secret_path: Path, public_path: Path, out: KeysCreated) -> None:
    """Make a key pair unless one is there. A public key alone is left alone: its secret
    lives elsewhere (another host, or a client that made its own pair)."""
    if secret_path.exists():
        ident = load_secret_file(secret_path, name)
        out.existing.append(secret_path)
    elif public_path.exists():
        load_public_key(public_path)  # well formed, at least
        out.existing.append(public_path)
        return
    else:
        ident = CurveIdentity.generate(name)
        wrote = _write_new(secret_path, _cert_text(name, ident.public, ident.secret), 0o600)
        if not wrote:  # made concurrently: use that one
            ident = load_secret_file(secret_path, name)
        (out.created if wrote else out.existing).append(secret_path)
    if public_path.exists():
        if load_public_key(public_path) != ident.public:
            raise SecurityError(
                f"{public_path} does not hold the public key of {secret_path}; "
                f"remove the wrong one by hand (ordo keys never replaces a key)"
            )
        out.existing.append(public_path)
    elif _write_new(public_path, _cert_text(name, ident.public, None), 0o644):
        out.created.append(public_path)
    else:
        out.existing.append(public_path)


def create_keys(data_dir: str | Path, roles: Sequence[str], clients: Sequence[str]) -> KeysCreated:
    """Create what is missing of a key pair per role and per client, and the allowlist
    entry (public key) of each client. Idempotent: never overwrites a key."""
    for name in (*roles, *clients):
        check_name(name)
    root = keys_dir(data_dir)
    _private_dir(root)
    for sub in (CLIENTS_DIR, CLIENT_SECRETS_DIR):
        _private_dir(root / sub)
    allowed = {p.name for p in (root / CLIENTS_DIR).glob(f"*{PUBLIC_SUFFIX}")}
    allowed |= {f"{c}{PUBLIC_SUFFIX}" for c in clients}
    if len(allowed) > limits.curve_allowlist_keys_max:
        raise SecurityError(
            f"{root / CLIENTS_DIR}: the allowlist would hold {len(allowed)} client keys, "
            f"more than {limits.curve_allowlist_keys_max}"
        )
    out = KeysCreated()
    for role in dict.fromkeys(roles):
        _create_pair(role, role_secret_path(data_dir, role), role_public_path(data_dir, role), out)
    for client in dict.fromkeys(clients):
        _create_pair(
            client, client_secret_path(data_dir, client), client_public_path(data_dir, client), out
        )
    return out


# The allowlist and the ZAP handler ---------------------------------------------------


@dataclass(frozen=True)
class AllowList:
    """Who may connect: Z85 public key -> name, for roles and for clients."""

    roles: Mapping[bytes, str]
    clients: Mapping[bytes, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in (*self.roles, *self.clients):
            invariant(is_z85_key(key), "allowlist keys are Z85 CURVE public keys")

    @classmethod
    def of_keys(cls, role_keys: Iterable[bytes], client_keys: Iterable[bytes] = ()) -> AllowList:
        """An allowlist of bare keys (each named by its own text)."""
        return cls({k: k.decode() for k in role_keys}, {k: k.decode() for k in client_keys})


def load_allowlist(data_dir: str | Path, roles: Sequence[str]) -> AllowList:
    """The public keys of ``roles`` (each must exist) and every ``keys/clients/*.key``."""
    root = keys_dir(data_dir)
    _check_dir(root)
    _check_dir(root / CLIENTS_DIR)
    role_keys = {load_role_public(data_dir, r): r for r in roles}
    files = sorted((root / CLIENTS_DIR).glob(f"*{PUBLIC_SUFFIX}"))
    if len(files) > limits.curve_allowlist_keys_max:
        raise SecurityError(
            f"{root / CLIENTS_DIR}: {len(files)} client keys, more than "
            f"{limits.curve_allowlist_keys_max}"
        )
    client_keys = {load_public_key(f): f.name[: -len(PUBLIC_SUFFIX)] for f in files}
    return AllowList(MappingProxyType(role_keys), MappingProxyType(client_keys))


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


# Sockets -------------------------------------------------------------------------


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
