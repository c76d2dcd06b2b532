"""CURVE key material on disk: who holds a key pair, where its files live, creating
them and loading them, and the allowlist of who may connect.

Key material lives in ``<data_dir>/keys/`` (zmq certificate format, readable by
``zmq.auth.load_certificate``):

  keys/                     0700
    <role>.key              public key of a role (sequencer-0, r0p1, ...)
    <role>.key_secret       its secret key, 0600
    clients/                0700, the allowlist: <client>.key, one public key per client
    client-secrets/         0700, <client>.key_secret made by ``ordo keys --client``

On a multi-host cluster a host needs its own roles' secrets, every role's public key
and the allowlist; a client needs its own secret and the sequencers' public keys.
``SecurityError`` (here, the package's lowest module) is what the ZAP handler and the
socket set-up raise too.

Invariants:
- A secret key file is created with mode 0600 from the start (os.open, O_EXCL) in a
  0700 directory, and is never overwritten: creating keys again adds what is missing.
- A secret key file readable or writable by group or others is refused on load, as
  ssh refuses such keys; so is a key directory that group or others can write.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import zmq

from cluster.config import ClusterConfig
from txn_library import limits
from txn_library.errors import OrdoError, invariant
from txn_library.wire.curve import is_z85_key

KEYS_DIR = "keys"
CLIENTS_DIR = "clients"  # the allowlist of client public keys
CLIENT_SECRETS_DIR = "client-secrets"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
# The client key ``ordo keys`` always makes: the command line's own calls (status, call).
ADMIN_CLIENT = "admin"

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class SecurityError(OrdoError):
    """Key material is missing, malformed or unsafe, or a socket cannot be secured."""


# Roles ---------------------------------------------------------------------------


def sequencer_role(member: int) -> str:
    return f"sequencer-{member}"


def partition_role(replica: int, partition: int) -> str:
    return f"r{replica}p{partition}"


def reader_role(reader: int) -> str:
    return f"reader-{reader}"


def role_names(config: ClusterConfig) -> list[str]:
    """Every identity of the cluster that holds a key pair: each sequencer, then each
    partition of each replica, then each reader."""
    seq: Any = getattr(config, "sequencers", 1)
    count = seq if isinstance(seq, int) else len(seq)
    return (
        [sequencer_role(i) for i in range(count)]
        + [partition_role(r, p) for r in range(config.replicas) for p in range(config.partitions)]
        + [reader_role(i) for i in range(getattr(config, "readers", 0))]
    )


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


def read_key_file(path: Path, secret: bool) -> bytes:
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
    text = read_key_file(path, secret=False)
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
    text = read_key_file(path, secret=True)
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


def private_dir(path: Path) -> None:
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
    check_key_dir(path)


def check_key_dir(path: Path) -> None:
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


def write_new_file(path: Path, data: bytes, mode: int) -> bool:
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
        wrote = write_new_file(secret_path, _cert_text(name, ident.public, ident.secret), 0o600)
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
    elif write_new_file(public_path, _cert_text(name, ident.public, None), 0o644):
        out.created.append(public_path)
    else:
        out.existing.append(public_path)


def create_keys(data_dir: str | Path, roles: Sequence[str], clients: Sequence[str]) -> KeysCreated:
    """Create what is missing of a key pair per role and per client, and the allowlist
    entry (public key) of each client. Idempotent: never overwrites a key."""
    for name in (*roles, *clients):
        check_name(name)
    root = keys_dir(data_dir)
    private_dir(root)
    for sub in (CLIENTS_DIR, CLIENT_SECRETS_DIR):
        private_dir(root / sub)
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


# The allowlist ------------------------------------------------------------------


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
    check_key_dir(root)
    check_key_dir(root / CLIENTS_DIR)
    role_keys = {load_role_public(data_dir, r): r for r in roles}
    files = sorted((root / CLIENTS_DIR).glob(f"*{PUBLIC_SUFFIX}"))
    if len(files) > limits.curve_allowlist_keys_max:
        raise SecurityError(
            f"{root / CLIENTS_DIR}: {len(files)} client keys, more than "
            f"{limits.curve_allowlist_keys_max}"
        )
    client_keys = {load_public_key(f): f.name[: -len(PUBLIC_SUFFIX)] for f in files}
    return AllowList(MappingProxyType(role_keys), MappingProxyType(client_keys))
