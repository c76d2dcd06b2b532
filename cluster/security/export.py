"""Keys per host: what one host of a multi-host cluster holds, and writing it to a
directory to copy there (``ordo keys export --host H DIR``).

A host gets the secret key files of the roles cluster.json places on it (sequencers,
partitions, readers), the public key of every role (it connects to them), the client
allowlist (``keys/clients/*.key``: its servers admit those clients) and, when it runs
a sequencer, the ZooKeeper password (``keys/zookeeper.secret``). No client secret goes
unless asked for by name (``with_clients``): a host runs servers, and a client's
secret belongs to whoever makes its calls. DIR then holds ``cluster.json`` and
``keys/`` as a data directory does, so ``ordo sequencer --cluster DIR/cluster.json``
(or any role of the host) finds its keys in ``DIR/keys/``.

Invariants:
- Nothing a host does not need is written: no other role's secret, no client secret
  not named. Every file written is checked first as loading it would be (a secret
  0600 and matching its public key; a public key file holding no secret).
- A secret file is created 0600 from the start, in 0700 directories; no key file in
  DIR is ever replaced. DIR must be new, empty, or an earlier export for the same
  host whose key files are identical and which holds nothing this export would not
  write; otherwise nothing is written. Only ``cluster.json`` is brought up to date.
- The marker file (``MARKER``) is written before any key, so an export cut short is
  recognised as this host's and completed by running it again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.config import CONFIG_FILE, LOCAL, ClusterConfig
from cluster.ordering_zk import SECRET_FILE as ZOOKEEPER_SECRET_FILE
from cluster.security.keys import (
    CLIENT_SECRETS_DIR,
    CLIENTS_DIR,
    KEYS_DIR,
    PUBLIC_SUFFIX,
    SECRET_SUFFIX,
    SecurityError,
    check_key_dir,
    check_name,
    load_public_key,
    load_secret_file,
    private_dir,
    read_key_file,
    role_names,
    write_new_file,
)
from txn_library import limits

MARKER = "ordo-keys-export.json"  # {"host": H}: what DIR is an export of
_EXTRA_SHOWN_MAX = 5  # files named in a refusal (the rest counted)


def host_roles(config: ClusterConfig) -> dict[str, list[str]]:
    """Every host of the cluster -> the roles holding a key pair placed on it, in
    ``role_names`` order. A host with none (a ZooKeeper server's only) maps to [].
    Without placements every role is on ``local`` (127.0.0.1)."""
    hosts: dict[str, list[str]] = {name: [] for name in config.hosts}
    sequencers = config.sequencer_hosts or (LOCAL,) * config.sequencers
    partitions = config.partition_hosts or ((LOCAL,) * config.partitions,) * config.replicas
    readers = config.reader_hosts or (LOCAL,) * config.readers
    placed = [*sequencers, *(h for row in partitions for h in row), *readers]
    roles = role_names(config)
    if len(roles) != len(placed):
        raise SecurityError("internal: role_names and the placement disagree")
    for role, host in zip(roles, placed, strict=True):
        hosts.setdefault(host, []).append(role)
    for name in config.zookeeper_hosts:
        hosts.setdefault(name, [])
    return hosts


@dataclass(frozen=True)
class _File:
    """One file of an export: its path under DIR, bytes and mode."""

    rel: Path
    data: bytes
    mode: int
    replaceable: bool = False  # cluster.json only: the source is authoritative


@dataclass
class Exported:
    """What ``export_host_keys`` did: the host's roles, files written and left as they
    were (identical, from an earlier export)."""

    host: str
    roles: list[str]
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)


def export_host_keys(
    data_dir: str | Path,
    config: ClusterConfig,
    host: str,
    out_dir: str | Path,
    with_clients: Sequence[str] = (),
) -> Exported:
    """Write into ``out_dir`` what ``host`` needs of the keys in ``data_dir/keys``,
    with ``data_dir/cluster.json``. Raises SecurityError, naming what to do, for an
    unknown host, a missing or unsafe source key, or an ``out_dir`` it may not use;
    then nothing is written."""
    placement = host_roles(config)
    if host not in placement:
        raise SecurityError(
            f"no host {host!r} in this cluster; its hosts are {', '.join(placement)}"
            + ("" if config.hosts else " (cluster.json names no hosts: all roles are local)")
        )
    roles = placement[host]
    files = _plan(Path(data_dir), config, host, roles, [check_name(c) for c in with_clients])
    out = Path(out_dir)
    _check_out_dir(out, host, files)
    done = Exported(host, roles)
    _write_marker(out, host)
    for f in files:
        _write_one(out, f, done)
    return done


def _plan(
    src: Path, config: ClusterConfig, host: str, roles: list[str], clients: list[str]
) -> list[_File]:
    """Every file of the export, read from ``src`` and checked as loading would."""
    keys = src / KEYS_DIR
    check_key_dir(keys)
    check_key_dir(keys / CLIENTS_DIR)
    files = [_File(Path(CONFIG_FILE), _read_config(src), 0o644, replaceable=True)]
    public: dict[str, bytes] = {}
    for role in role_names(config):
        path = keys / f"{role}{PUBLIC_SUFFIX}"
        public[role] = load_public_key(path)
        files.append(_File(Path(KEYS_DIR, path.name), read_key_file(path, secret=False), 0o644))
    for role in roles:
        files.append(_secret_file(keys / f"{role}{SECRET_SUFFIX}", role, public[role]))
    allowlist = sorted((keys / CLIENTS_DIR).glob(f"*{PUBLIC_SUFFIX}"))
    if len(allowlist) > limits.curve_allowlist_keys_max:
        raise SecurityError(
            f"{keys / CLIENTS_DIR}: {len(allowlist)} client keys, more than "
            f"{limits.curve_allowlist_keys_max}"
        )
    for path in allowlist:
        load_public_key(path)
        rel = Path(KEYS_DIR, CLIENTS_DIR, path.name)
        files.append(_File(rel, read_key_file(path, secret=False), 0o644))
    for client in dict.fromkeys(clients):
        path = keys / CLIENT_SECRETS_DIR / f"{client}{SECRET_SUFFIX}"
        if not path.exists():
            raise SecurityError(
                f"no secret key of client {client!r} at {path}: create it with "
                f"`ordo keys --data-dir {src} --client {client}` (or leave it to the "
                f"client, who holds its own)"
            )
        files.append(_secret_file(path, client, None, sub=CLIENT_SECRETS_DIR))
    zk_secret = keys / ZOOKEEPER_SECRET_FILE
    if any(r.startswith("sequencer-") for r in roles) and zk_secret.exists():
        data = read_key_file(zk_secret, secret=True)  # refused if open to others
        files.append(_File(Path(KEYS_DIR, ZOOKEEPER_SECRET_FILE), data, 0o600))
    return files


def _read_config(src: Path) -> bytes:
    path = src / CONFIG_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SecurityError(f"no cluster config at {path}") from None


def _secret_file(path: Path, name: str, public: bytes | None, sub: str = "") -> _File:
    ident = load_secret_file(path, name)  # 0600, and its public key is its secret's
    if public is not None and ident.public != public:
        raise SecurityError(
            f"{path} and {path.with_name(name + PUBLIC_SUFFIX)} are not one key pair; "
            f"remove the wrong one by hand"
        )
    return _File(Path(KEYS_DIR, sub, path.name), read_key_file(path, secret=True), 0o600)


def _check_out_dir(out: Path, host: str, files: list[_File]) -> None:
    """Refuse an ``out`` that is not new, empty, or this host's earlier export whose
    keys are the ones this export would write and which holds nothing else."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SecurityError(f"{out} is not a directory")
    present = sorted(p.relative_to(out) for p in out.rglob("*") if not p.is_dir())
    if not present:
        return
    earlier = _marker_host(out)
    if earlier is None:
        raise SecurityError(
            f"{out} is not empty and holds no key export ({MARKER}); export into a new "
            f"or empty directory"
        )
    if earlier != host:
        raise SecurityError(
            f"{out} holds the keys exported for host {earlier!r}, not {host!r}; export "
            f"{host!r} into another directory (or remove {out} to redo {earlier!r})"
        )
    planned = {f.rel: f for f in files}
    extra = [p for p in present if p != Path(MARKER) and p not in planned]
    if extra:
        shown = ", ".join(str(p) for p in extra[:_EXTRA_SHOWN_MAX])
        more = f" and {len(extra) - _EXTRA_SHOWN_MAX} more" if len(extra) > _EXTRA_SHOWN_MAX else ""
        raise SecurityError(
            f"{out} holds {shown}{more}, which an export for {host!r} would not write "
            f"(a role moved off the host, a client left the allowlist, or an earlier "
            f"--with-client): remove them, or export into a new directory"
        )
    for rel in present:
        f = planned.get(rel)
        if f is None or f.replaceable:
            continue
        if read_key_file(out / rel, secret=f.mode == 0o600) != f.data:
            raise SecurityError(
                f"{out / rel} is not the cluster's key of that name (keys are never "
                f"replaced): the directory holds another cluster's export; use a new one"
            )


def _marker_host(out: Path) -> str | None:
    try:
        text = (out / MARKER).read_text()
    except FileNotFoundError:
        return None
    try:
        host = json.loads(text)["host"]
    except (ValueError, KeyError, TypeError):
        raise SecurityError(f"{out / MARKER}: not a key export marker") from None
    if not isinstance(host, str):
        raise SecurityError(f"{out / MARKER}: not a key export marker")
    return host


def _write_marker(out: Path, host: str) -> None:
    private_dir(out)
    if _marker_host(out) is None:
        write_new_file(out / MARKER, (json.dumps({"host": host}) + "\n").encode(), 0o644)


def _write_one(out: Path, f: _File, done: Exported) -> None:
    path = out / f.rel
    for parent in reversed(f.rel.parents[:-1]):  # keys/, keys/clients/, ...
        private_dir(out / parent)
    if f.replaceable:
        if path.exists() and path.read_bytes() == f.data:
            done.unchanged.append(path)
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(f.data)
        tmp.replace(path)
        done.written.append(path)
    elif write_new_file(path, f.data, f.mode):
        done.written.append(path)
    elif read_key_file(path, secret=f.mode == 0o600) == f.data:  # an earlier export's
        done.unchanged.append(path)
    else:  # written since _check_out_dir looked: another export at the same time
        raise SecurityError(f"{path} changed while exporting into {out}; run it again")
