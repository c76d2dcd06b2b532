"""Checkpoints loaded and validated: a chain's headers and links (``chain_of``,
``chain_epochs``), its state in a fresh Storage (``load``, ``load_newest``,
``iter_rows``), one file validated as a load would, without loading its chain where it
can (``check``), and the headers in a directory (``list_checkpoints``).

Invariant:
- A checkpoint is valid only if every file of its chain (and its static file) reads
  whole: every frame's CRC holds, the footer is present, row counts match, each
  delta's parent link (epoch, state hash, depth, base, static hash) matches its
  parent's header; the base's and static file's rows hash to their headers; and the
  state the chain builds, hashed from the bytes of its rows, equals the checkpoint's
  header. (A load hashes a chain's deltas once, at its end; if the state differs it
  loads again file by file, each file's state against its header, to name the file
  at fault. A delta whose wrong row a later delta overwrites yields a right state: it
  fails only its own epoch's load, and verify's check of it.) An invalid one is
  skipped with a warning, never half-loaded; ``CheckpointInvalid.epoch`` names the
  file at fault.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from pathlib import Path

import msgpack

from executor.core.changes import Changes
from executor.core.checkpoint.format import (
    _MASK64,
    BASE,
    DELTA,
    NAME_RE,
    STATIC,
    CheckpointInfo,
    CheckpointInvalid,
    _digest,
    _first,
    _second,
    _third,
    checkpoint_name,
    static_name,
)
from executor.core.checkpoint.reader import (
    _KEYS,
    _check_hash_only,
    _epoch_of,
    _frames,
    read_info,
)
from executor.core.storage import Storage
from txn_library.heap import gc_paused

log = logging.getLogger("ordo.checkpoint")


def chain_of(path: Path) -> list[CheckpointInfo]:
    """Headers of the chain that ``path``'s state needs, base first (headers only).

    Checks every parent link; raises CheckpointInvalid naming the file at fault.
    """
    info = read_info(path)
    if info.kind == STATIC:
        raise CheckpointInvalid(f"{path}: a static tables file, not a checkpoint")
    chain = [info]
    while info.kind == DELTA:
        parent_path = path.parent / checkpoint_name(info.parent_epoch, info.partition)
        if not info.parent_epoch < info.epoch:
            raise CheckpointInvalid(f"{info.path}: parent epoch {info.parent_epoch}", info.epoch)
        if not parent_path.exists():
            raise CheckpointInvalid(
                f"{info.path}: its parent {parent_path.name} is missing", info.parent_epoch
            )
        parent = read_info(parent_path)
        problem = _link_problem(parent, info)
        if problem is not None:
            raise CheckpointInvalid(f"{info.path}: {problem}", info.epoch)
        chain.append(parent)
        info = parent
    chain.reverse()
    return chain


def _link_problem(parent: CheckpointInfo, child: CheckpointInfo) -> str | None:
    if parent.kind == STATIC:
        return f"its parent {parent.path.name} is a static tables file"
    want = (child.parent_epoch, child.parent_state_hash, child.depth - 1, child.base_epoch)
    have = (parent.epoch, parent.state_hash, parent.depth, parent.base_epoch)
    if want != have:
        return (
            f"its parent link (epoch, hash, depth, base) {want} does not match "
            f"{parent.path.name}: {have}"
        )
    if (parent.partition, parent.partitions, parent.static_hash, parent.base_rows) != (
        child.partition,
        child.partitions,
        child.static_hash,
        child.base_rows,
    ):
        return f"partition, static tables or base size differ from {parent.path.name}"
    if parent.chain_rows + child.rows != child.chain_rows:
        return f"chain row count does not follow from {parent.path.name}"
    return None


def chain_epochs(path: Path) -> list[int]:
    """Epochs of the files ``path``'s chain names, newest first, as far as headers go
    (a missing or unreadable parent ends the list; nothing is validated)."""
    out = []
    current: Path | None = path
    while current is not None and current.exists():
        try:
            info = read_info(current)
        except CheckpointInvalid:
            out.append(_epoch_of(current) or 0)
            break
        out.append(info.epoch)
        if info.kind != DELTA or not info.parent_epoch < info.epoch:
            break
        current = current.parent / checkpoint_name(info.parent_epoch, info.partition)
    return out


def _load_file(
    info: CheckpointInfo, storage: Storage, charged_to: int | None, hashed: bool = True
) -> None:
    """Apply one file to ``storage``, validating it; its hash must then equal its
    header's (unless not ``hashed``: a file of a chain whose caller hashes the state
    at its end, ``load``). Rows are not decoded: each key's bytes become a pending row
    of the Storage (the writer wrote ``msgpack([table, key, row])`` and the CRC
    vouches for the bytes, so they are what packing would give; the key it is loaded
    under is checked when the row is decoded, ``pending.fault``). Indexes are left to
    the caller (``Storage.defer_indexes``)."""
    path = info.path
    epoch = info.epoch if charged_to is None else charged_to
    try:
        for (table, keys, deleted), encodings in _frames(path, info, _KEYS):
            if info.kind == DELTA:
                _apply_delta_rows(storage, table, keys, deleted, encodings, hashed, path, epoch)
            else:
                _insert_rows(
                    storage, info.kind, table, keys, deleted, encodings, hashed, path, epoch
                )
    except CheckpointInvalid as e:
        raise CheckpointInvalid(str(e), epoch) from None
    if not hashed:
        return
    if info.kind == STATIC:
        ok = storage.static_hash == info.static_hash
        have, want = storage.static_hash, info.static_hash
    else:
        ok = storage.state_hash == info.state_hash
        have, want = storage.state_hash, info.state_hash
    if not ok:
        raise CheckpointInvalid(f"{path}: rows hash to {have:016x}, header says {want:016x}", epoch)


def _insert_rows(
    storage: Storage,
    kind: str,
    table: str,
    keys: tuple,
    deleted: tuple,
    encodings: Sequence[bytes],
    hashed: bool,
    path: Path,
    epoch: int,
) -> None:
    if deleted:
        raise CheckpointInvalid(f"{path}: a deleted row in a {kind}", epoch)
    try:
        if storage.is_replicated(table) != (kind == STATIC):
            raise CheckpointInvalid(f"{path}: table {table} does not belong in a {kind}", epoch)
        digests = sum(map(_digest, encodings)) if hashed else 0
        added = storage.insert_encoded(table, keys, encodings, digests)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise CheckpointInvalid(f"{path}: malformed rows: {e}", epoch) from None
    if added != len(keys):
        raise CheckpointInvalid(f"{path}: a key of {table} appears twice", epoch)


def _apply_delta_rows(
    storage: Storage,
    table: str,
    keys: tuple,
    deleted: tuple,
    encodings: Sequence[bytes],
    hashed: bool,
    path: Path,
    epoch: int,
) -> None:
    try:
        if storage.is_replicated(table):
            raise CheckpointInvalid(f"{path}: a delta writes a replicated table", epoch)
        digests = None
        if hashed:  # else a chain's delta, hashed with the whole state after it
            digests = list(map(_digest, encodings))
            for i in deleted:
                digests[i] = 0
        storage.install_encoded(table, keys, encodings, deleted, digests)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise CheckpointInvalid(f"{path}: malformed rows: {e}", epoch) from None


def load(path: Path) -> tuple[CheckpointInfo, Storage]:
    """Load and fully validate one checkpoint (its chain and static file) into a fresh
    Storage. Raises CheckpointInvalid naming the file at fault (``.epoch``).

    A chain's files (its base and deltas) are loaded unhashed, without hashing each
    overwritten row out; the state's hash is then computed once from every row's bytes
    and must equal the last file's header (the static file's hash, and every file's
    CRCs, counts and links, are validated as they are read). If it does not, the chain
    is loaded again file by file, each file's hash checked, to name the file at fault."""
    chain = chain_of(path)
    if len(chain) > 1:
        storage = _load_chain(path, chain, per_file=False)
        if storage.state_hash == chain[-1].state_hash:
            return chain[-1], storage
        del storage
    return chain[-1], _load_chain(path, chain, per_file=True)


def _load_chain(path: Path, chain: list[CheckpointInfo], per_file: bool) -> Storage:
    """The state of ``chain`` in a fresh Storage. ``per_file``: each file's hash checked
    against its header as it is applied (CheckpointInvalid naming it); else the base and
    deltas are loaded unhashed and the Storage's hash recomputed from its rows at the
    end, for the caller to compare (each base row is digested once, not twice)."""
    storage = Storage()
    with gc_paused(freeze=True):  # the loaded state is long-lived: see settle_heap
        static_hash = chain[0].static_hash
        if static_hash:
            static = path.parent / static_name(chain[0].partition, static_hash)
            try:
                info = read_info(static)
                if (info.kind, info.static_hash) != (STATIC, static_hash):
                    raise CheckpointInvalid(f"{static}: not the static tables file named")
            except CheckpointInvalid as e:
                raise CheckpointInvalid(str(e), chain[0].epoch) from None
            _load_file(info, storage, chain[0].epoch)
        for info in chain:
            _load_file(info, storage, None, hashed=per_file)
        if not per_file:
            storage.rehash_pending()
        storage.defer_indexes()  # each built when its table is first scanned
    return storage


def check(
    path: Path, storage: Storage | None = None, since: tuple[int, int] | None = None
) -> CheckpointInfo:
    """Validate one checkpoint file as ``load`` would, without loading its chain if it
    can: a base by the digests of its bytes (and its static file); a delta whose parent
    is ``since`` = (epoch, state hash) against ``storage``, a state whose hash equals
    the delta's header and that was exactly the parent's state when it started
    recording changes (``Storage.track_changes``, replay's way). Then the delta holds
    the right rows iff its keys are the keys written since and its rows' digests (of
    the bytes read) sum to those of the rows written: the parent's rows drop out of
    both sides. Anything else is loaded whole. A base (or static file) whose header
    hash equals ``storage``'s is checked by its bytes' digests without decoding them
    (``_check_hash_only``): bytes that hash to a right state's hash are its rows."""
    info = read_info(path)
    if info.kind == BASE:
        known = storage is not None and storage.state_hash == info.state_hash
        _check_hash_only(path, info, decode=not known)
        if info.static_hash:
            static = path.parent / static_name(info.partition, info.static_hash)
            known = storage is not None and storage.static_hash == info.static_hash
            try:
                _check_hash_only(static, None, decode=not known)
            except CheckpointInvalid as e:
                raise CheckpointInvalid(str(e), info.epoch) from None
        return info
    if info.kind != DELTA:
        raise CheckpointInvalid(f"{path}: a static tables file, not a checkpoint")
    if (
        storage is None
        or since is None
        or not storage.tracking
        or info.parent_epoch != since[0]
        or storage.state_hash != info.state_hash
    ):
        loaded, _ = load(path)
        return loaded
    if info.parent_state_hash != since[1]:
        raise CheckpointInvalid(
            f"{path}: names parent hash {info.parent_state_hash:016x}, the state at epoch "
            f"{since[0]} hashes to {since[1]:016x}",
            info.epoch,
        )
    if _delta_is_record(path, info, storage.changes()):
        return info
    keys: dict[str, set[tuple]] = {}
    total = 0
    for rows, _encodings, digests in _frames(path, info):
        tables = set(map(_first, rows))
        if len(tables) != 1:
            raise CheckpointInvalid(f"{path}: a rows frame of a delta mixes tables", info.epoch)
        (table,) = tables
        seen = keys.setdefault(table, set())
        before = len(seen)
        seen.update(map(_second, rows))
        if len(seen) - before != len(rows):
            raise CheckpointInvalid(f"{path}: a key of {table} appears twice", info.epoch)
        if None in list(map(_third, rows)):
            digests = [0 if r[2] is None else d for r, d in zip(rows, digests, strict=True)]
        total += sum(digests)
    written = {t: record for t, record in storage.changes().items() if record}
    if keys.keys() != written.keys() or any(keys[t] != written[t].keys() for t in keys):
        raise CheckpointInvalid(
            f"{path}: its keys are not the keys written since epoch {since[0]}", info.epoch
        )
    want = sum(_digest(b) for record in written.values() for b in record.values() if b)
    if total & _MASK64 != want & _MASK64:
        raise CheckpointInvalid(
            f"{path}: its rows hash to {total & _MASK64:016x}, the rows written since "
            f"epoch {since[0]} to {want & _MASK64:016x}",
            info.epoch,
        )
    return info


def _delta_is_record(path: Path, info: CheckpointInfo, record: Changes) -> bool:
    """Whether a delta's rows are exactly the bytes its writer writes for ``record``
    (each written key's row as packed, a deleted key packed as a row of None), each
    once, one table per frame, under their keys (and a deleted one marked deleted):
    then it holds the rows written since its parent and loads. Checked by the rows'
    bytes and keys, decoding no row (a version 2 file's frames carry no keys: its rows are
    decoded for their keys); the order within a table is not compared (a live
    partition records keys in the order its transactions finished, which concurrency
    may change; a replay in serial order). False (a row not in the record or twice, one
    missing, a file that does not read to its footer) leaves the judgement to
    ``check``'s decoding path, which names what is wrong."""
    pack = msgpack.Packer(autoreset=True).pack
    pools: dict[str, dict[tuple, bytes | None]] = {}
    dead: dict[str, set[tuple]] = {}  # deleted keys, per table
    for table, rows in record.items():
        if rows:
            pool = pools[table] = dict(rows)
            if None in pool.values():
                gone = dead[table] = {k for k, v in rows.items() if v is None}
                pool.update((k, pack((table, k, None))) for k in gone)
    try:
        for (table, keys, deleted), encodings in _frames(path, info, _KEYS):
            pool = pools.get(table)  # type: ignore[assignment]
            if pool is None:
                return False
            dead_keys = dead.get(table)
            marked: tuple[int, ...] = ()
            if dead_keys:
                marked = tuple(compress(range(len(keys)), map(dead_keys.__contains__, keys)))
            if marked != deleted or tuple(map(pool.pop, keys, repeat(None))) != tuple(encodings):
                return False  # a row not written since the parent, twice, or unmarked
    except Exception:  # any reading or decoding problem: the decoding path says what
        return False
    return not any(pools.values())


def iter_rows(path: Path) -> Iterator[tuple[str, tuple, tuple]]:
    """Every row of a checkpoint's state (static tables too), tables in name order and
    keys sorted. The chain is loaded and validated whole first (CheckpointInvalid)."""
    _, storage = load(path)
    yield from storage.rows()


def list_checkpoints(directory: Path, partition: int | None = None) -> list[CheckpointInfo]:
    """Headers of every checkpoint in ``directory`` (oldest first); unreadable ones skipped."""
    if not directory.exists():
        return []
    out = []
    for entry in sorted(directory.iterdir()):
        m = NAME_RE.fullmatch(entry.name)
        if m is None or (partition is not None and int(m.group(2)) != partition):
            continue
        try:
            out.append(read_info(entry))
        except CheckpointInvalid as e:
            log.warning("skipping checkpoint: %s", e)
    return sorted(out, key=lambda i: (i.epoch, i.partition))


def load_newest(
    directory: Path, partition: int, partitions: int
) -> tuple[CheckpointInfo, Storage] | None:
    """The newest checkpoint of ``partition`` that validates; corrupt ones are skipped
    (and so is every checkpoint whose chain holds a file found corrupt)."""
    bad: set[int] = set()
    for info in reversed(list_checkpoints(directory, partition)):
        if info.partitions != partitions:
            log.warning(
                "skipping %s: taken with %d partitions, cluster has %d",
                info.path,
                info.partitions,
                partitions,
            )
            continue
        if bad.intersection(chain_epochs(info.path)):
            log.warning("skipping %s: its chain holds a corrupt checkpoint", info.path.name)
            continue
        try:
            return load(info.path)
        except CheckpointInvalid as e:
            log.warning("skipping corrupt checkpoint: %s", e)
            bad.add(info.epoch if e.epoch is None else e.epoch)
    return None
