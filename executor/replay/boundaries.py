"""Boundaries: the states of a replica known without replay, and loading them.

A boundary is the state at the end of an epoch that needs no replay: genesis (epoch
0, ``ReplaySpec.genesis``) or a checkpoint (executor.core.checkpoint: every partition
snapshots at the same checkpoint-flagged epochs, one file per partition).

Invariants
- A state is trusted only when fully validated (``checkpoint.load``: every file of the
  checkpoint's chain, frame CRCs, footers, row counts, parent links, rows hash ==
  header hash after each file). A checkpoint whose header is unreadable is still a
  boundary (its epoch comes from the file name): it is reported, never silently
  merged away. So is one file missing, unless its partition's next checkpoint says it
  was not written (``previous_epoch``).
- Scanning reads headers only; rows are read when a boundary is loaded.
- Nothing here writes to the checkpoint directories.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from executor.core import checkpoint
from executor.core.checkpoint import CheckpointInfo, CheckpointInvalid
from executor.core.genesis import genesis_rows, genesis_storage
from executor.core.heap import settle_heap
from executor.core.state_hash import MASK64
from executor.deterministic.replica import LocalReplica
from executor.replay.spec import ReplaySpec
from txn_library import deployed


@dataclass(frozen=True)
class Boundary:
    """A known state at the end of ``epoch``: genesis (0) or one checkpoint per partition.

    ``problems`` lists what is wrong with it as far as the headers tell (missing
    partition, unreadable header, header disagreeing with its file name); the rows
    are validated only when the state is loaded.
    """

    epoch: int
    paths: tuple[str, ...] = ()  # per partition ("" = missing); empty for genesis
    hashes: tuple[int | None, ...] = ()  # header state hash per partition
    next_txn_id: int = 0
    problems: tuple[str, ...] = ()
    rows: int = 0  # rows a load of it reads (its chains' rows, all partitions; 0: unknown)
    delta_rows: int = 0  # of which in deltas (each costs a load more than a base's row)

    @property
    def usable(self) -> bool:
        return not self.problems

    @property
    def state_hash(self) -> int | None:
        if self.epoch == 0 or any(h is None for h in self.hashes):
            return None
        return sum(h for h in self.hashes if h is not None) & MASK64


GENESIS = Boundary(0)


def scan_checkpoints(checkpoint_dir: str | Path, partitions: int) -> list[Boundary]:
    """Every checkpoint epoch in a replica's directory, oldest first (headers only).

    An epoch is a boundary as soon as one file names it, so a corrupt or missing file
    makes the boundary unusable and reported, never silently skipped. The one gap that
    is no fault: a partition that did not write a boundary because its previous writer
    was busy (or failed) says so in its next checkpoint's header (``previous_epoch``
    before the boundary) and in a skip marker (``checkpoint.mark_skipped``: the only
    word at the end of a history, where no next checkpoint exists); a boundary that
    only such partitions miss is not a boundary of this history (its files stay
    members of their partitions' chains).
    """
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint directory {directory}")
    files: dict[int, dict[int, Path]] = {}
    marked: set[tuple[int, int]] = set()  # (partition, epoch) skip markers
    for entry in sorted(directory.iterdir()):
        m = checkpoint.NAME_RE.fullmatch(entry.name)
        if m is not None:
            files.setdefault(int(m.group(1)), {})[int(m.group(2))] = entry
            continue
        m = checkpoint.SKIP_NAME_RE.fullmatch(entry.name)
        if m is not None:
            marked.add((int(m.group(2)), int(m.group(1))))
    headers: dict[tuple[int, int], CheckpointInfo | CheckpointInvalid] = {}
    for epoch, by_part in files.items():
        for p, path in by_part.items():
            try:
                headers[epoch, p] = checkpoint.read_info(path)
            except CheckpointInvalid as e:
                headers[epoch, p] = e
    out = []
    for epoch in sorted(files):
        by_part = files[epoch]
        missing = [p for p in range(partitions) if p not in by_part]
        if missing and all(
            (p, epoch) in marked or _skipped(headers, files, p, epoch) for p in missing
        ):
            continue
        out.append(_boundary(epoch, by_part, headers, partitions))
    return out


def _skipped(
    headers: dict[tuple[int, int], CheckpointInfo | CheckpointInvalid],
    files: dict[int, dict[int, Path]],
    partition: int,
    epoch: int,
) -> bool:
    """Whether ``partition`` left ``epoch`` unwritten on purpose: its next checkpoint
    names an earlier one as its predecessor."""
    later = [e for e in files if e > epoch and partition in files[e]]
    if not later:
        return False
    info = headers[min(later), partition]
    return isinstance(info, CheckpointInfo) and 0 <= info.previous_epoch < epoch


def _boundary(
    epoch: int,
    by_part: dict[int, Path],
    headers: dict[tuple[int, int], CheckpointInfo | CheckpointInvalid],
    partitions: int,
) -> Boundary:
    paths: list[str] = []
    hashes: list[int | None] = []
    next_ids: set[int] = set()
    problems: list[str] = []
    rows = delta_rows = 0
    for p in sorted(set(by_part) - set(range(partitions))):
        problems.append(f"p{p}: checkpoint of a partition the cluster does not have")
    for p in range(partitions):
        path = by_part.get(p)
        if path is None:
            paths.append("")
            hashes.append(None)
            problems.append(f"p{p}: missing")
            continue
        paths.append(str(path))
        info = headers[epoch, p]
        try:
            if isinstance(info, CheckpointInvalid):
                raise info
            _check_header(info, epoch, p, partitions)
        except CheckpointInvalid as e:
            hashes.append(None)
            problems.append(f"p{p}: {e}")
            continue
        hashes.append(info.state_hash)
        next_ids.add(info.next_txn_id)
        rows += info.chain_rows
        delta_rows += info.chain_rows - info.base_rows
    if len(next_ids) > 1:
        problems.append(f"partitions disagree on the next txn id: {sorted(next_ids)}")
    return Boundary(
        epoch,
        tuple(paths),
        tuple(hashes),
        next_ids.pop() if len(next_ids) == 1 else -1,
        tuple(problems),
        rows,
        delta_rows,
    )


def _check_header(info: CheckpointInfo, epoch: int, partition: int, partitions: int) -> None:
    if (info.epoch, info.partition, info.partitions) != (epoch, partition, partitions):
        raise CheckpointInvalid(
            f"{info.path}: header says epoch {info.epoch}, partition "
            f"{info.partition}/{info.partitions}; expected {epoch}, {partition}/{partitions}"
        )


def peer_checkpoint_dirs(checkpoint_dir: str | Path) -> dict[int, Path]:
    """Other replicas' checkpoint directories beside ``data_dir/replica-R/checkpoints``."""
    own = Path(checkpoint_dir).resolve()
    out: dict[int, Path] = {}
    if own.name != "checkpoints" or re.fullmatch(r"replica-\d+", own.parent.name) is None:
        return out  # not in a cluster directory: no peers to compare with
    for d in sorted(own.parent.parent.glob("replica-*/checkpoints")):
        m = re.fullmatch(r"replica-(\d+)", d.parent.name)
        if m is not None and d.resolve() != own and d.is_dir():
            out[int(m.group(1))] = d
    return out


def load_boundary(spec: ReplaySpec, boundary: Boundary) -> LocalReplica:
    """A LocalReplica in the state of ``boundary``, fully validated (CheckpointInvalid,
    naming the file at fault: a checkpoint's chain may fail at an older file). Epoch 0
    with files: the partitions' genesis bases; without: the genesis function."""
    n = spec.partitions
    deployed.reset()  # one history per replay: what this one deployed comes next
    if boundary.epoch == 0 and not boundary.paths:
        storages = [genesis_storage(spec.genesis, spec.genesis_args, p, n) for p in range(n)]
        return LocalReplica(n, storages)
    if not boundary.usable:
        raise CheckpointInvalid(
            f"checkpoint at epoch {boundary.epoch}: " + "; ".join(boundary.problems),
            boundary.epoch,
        )
    # Procedures deployed through the log before the boundary, as the replica that
    # wrote it keeps them beside its checkpoints (later ones are met in the log).
    deployed.CodeStore(Path(boundary.paths[0]).parent / "deploys").install_all()
    loaded = []
    for p, path in enumerate(boundary.paths):
        info, storage = checkpoint.load(Path(path))
        _check_header(info, boundary.epoch, p, n)
        loaded.append((info, storage))
    settle_heap()  # the loaded rows live as long as the task (genesis_storage settles too)
    replica = LocalReplica(n, [s for _, s in loaded])
    for part, (info, _) in zip(replica.parts, loaded, strict=True):
        part.restore(info.epoch, info.next_txn_id, info.txns_applied)
    return replica


def boundary_rows(spec: ReplaySpec, boundary: Boundary) -> Iterator[tuple[str, tuple, tuple]]:
    """Every row of every partition at ``boundary`` (replicated tables repeat per partition;
    a checkpoint's chain is loaded and validated whole first)."""
    for p in range(spec.partitions):
        if boundary.epoch == 0:
            yield from genesis_rows(spec.genesis, spec.genesis_args, p, spec.partitions)
        else:
            yield from checkpoint.iter_rows(Path(boundary.paths[p]))
