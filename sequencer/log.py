"""Segmented, checksummed command log: the durable record of every sequenced epoch.

The sequencer appends one frame per epoch and calls ``sync`` once per epoch (the
group-commit point); an epoch must not be published before its frame is synced.
Replay, the log service and Spark read it back by epoch.

On-disk format
    The log directory holds segment files ``segment-{first_epoch:012d}.log``. A segment is
    a sequence of frames, each an 8-byte header ``struct.pack("<II", length,
    crc32c(payload))`` followed by ``length`` payload bytes. The payload is opaque here
    (a msgpack batch). Frames carry no epoch: frame ``i`` of a segment holds epoch
    ``first_epoch + i``.

Invariants
    - Epochs are consecutive integers starting at 1; every append is ``last_epoch + 1``.
    - Segments are contiguous: each starts at the epoch after its predecessor's last.
    - A payload is 1..``limits.log_frame_bytes_max`` bytes (an empty frame would be
      indistinguishable from zero fill).
    - A segment rolls when the next frame would take it past ``limits.segment_bytes_max``
      (a larger frame still goes alone in its own segment). The finished segment is
      fdatasynced before the next one is created, so only the last segment can hold
      unsynced bytes, and only the last segment may be empty.
    - The in-memory index is one ``array('Q')`` of frame offsets per segment.
    - ``marked`` lists, in order, the epochs on disk whose payload contains the marker
      bytes (by default a deploy call's packed name, txn_library.deployed.MARKER),
      found by recovery (the one thing the log looks for in a payload) and noted by
      whoever appends such a frame (``mark``: it decoded or built the batch), so that a
      sequencer finds its deploys without decoding every batch.

Recovery (on open) and ``iter_frames`` check every frame: header complete, length in
1..log_frame_bytes_max, payload complete, CRC32C matches; and that segment names are
contiguous. A frame that fails is either the torn tail or corruption, by this rule:

    A bad frame starting at byte ``p`` is a TORN TAIL iff it is in the last segment and
    every byte from its claimed end to EOF is zero (vacuously so when the claimed end is
    at or past EOF). The claimed end is ``p + 8 + length`` when its header is complete
    and its length is in range (only the CRC or the payload's size is wrong); otherwise
    the header says nothing about the frame's extent, and the claimed end is one maximal
    frame, ``p + 8 + log_frame_bytes_max``. So a header cut short is always torn, and a
    frame cut short (its claimed end past EOF) is torn. Zeros are allowed because a
    crash can leave a file extended by blocks (even the header's) whose data never landed.

    Any other bad frame is CORRUPTION (``LogCorruption``, naming file, offset and epoch):
    in particular any bad frame in an earlier segment, and a bad frame in the last
    segment followed by non-zero bytes (a later frame was written, so this one was once
    whole). Corruption is reported, never skipped.

Recovery truncates a torn tail to the end of the last whole frame, fsyncs, and counts
the cut in ``recovered_truncated_bytes``; it then removes an empty last segment (unless
it is the only segment and starts past epoch 1: its name is then the only record of
where epochs resume) and fdatasyncs the surviving last segment, whose frames may have
reached only the page cache before a process crash. ``iter_frames`` applies the same
rule without modifying anything.

Limit of the format: the header has no checksum of its own, so a flipped length bit
in one of the last frames of the last segment, pointing past EOF or out of range, looks
exactly like a torn write, and those frames are cut. Non-zero bytes further than one
maximal frame (8 + log_frame_bytes_max bytes) past the bad frame's start make it
corruption instead, so such a silent cut never exceeds one maximal frame of data.

A CommandLog has one owner and is not thread-safe. After a write or sync fails it
refuses further use: reopen it, so that recovery decides what is on disk.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from array import array
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import google_crc32c

from txn_library import limits
from txn_library.deployed import MARKER
from txn_library.errors import invariant

_HEADER = struct.Struct("<II")
_HEADER_BYTES = _HEADER.size
_SEGMENT_NAME = re.compile(r"segment-(\d{12,})\.log")
_ZERO_SCAN_CHUNK_BYTES = 1 << 16
_fdatasync = getattr(os, "fdatasync", os.fsync)


class LogCorruption(Exception):
    """A frame that fails validation and is not the torn tail. Never skipped."""

    def __init__(self, path: str | Path, offset: int, epoch: int, reason: str) -> None:
        super().__init__(f"{path}: byte offset {offset}, epoch {epoch}: {reason}")
        self.path = Path(path)
        self.offset = offset
        self.epoch = epoch
        self.reason = reason

    def __reduce__(self) -> tuple[type[LogCorruption], tuple[Path, int, int, str]]:
        # Spark pickles task exceptions; the default would call __init__(message).
        return (type(self), (self.path, self.offset, self.epoch, self.reason))


@dataclass(frozen=True, slots=True)
class _BadFrame:
    reason: str
    claimed_end: int | None  # offset + 8 + length; None if the header gives no usable length


@dataclass(slots=True)
class _Segment:
    first_epoch: int
    path: Path
    offsets: array[int]  # array('Q'): frame i (epoch first_epoch + i) starts at offsets[i]
    end_bytes: int  # end of the last whole frame; the file's size once flushed

    @property
    def last_epoch(self) -> int:
        return self.first_epoch + len(self.offsets) - 1


def _segment_name(first_epoch: int) -> str:
    return f"segment-{first_epoch:012d}.log"


def _list_segments(log_dir: Path) -> list[tuple[int, Path]]:
    """(first_epoch, path) of every segment file in log_dir, in epoch order."""
    found = []
    with os.scandir(log_dir) as entries:
        for entry in entries:
            match = _SEGMENT_NAME.fullmatch(entry.name)
            if match is not None:
                found.append((int(match.group(1)), Path(entry.path)))
    found.sort()
    return found


def _check_segment_start(path: Path, first_epoch: int, expected_epoch: int | None) -> None:
    if first_epoch < 1:
        raise LogCorruption(path, 0, first_epoch, "segment name gives an epoch below 1")
    if expected_epoch is not None and first_epoch != expected_epoch:
        raise LogCorruption(
            path,
            0,
            expected_epoch,
            f"segment starts at epoch {first_epoch} but the previous segment ends at "
            f"epoch {expected_epoch - 1}",
        )


def _read_frame(f: BinaryIO, offset: int, file_bytes: int) -> bytes | _BadFrame | None:
    """Read and validate the frame at ``offset`` of a file taken to be ``file_bytes`` long.

    Returns the payload, None at a clean end (offset == file_bytes), or why it is bad.
    Reads one frame at most, so memory stays within log_frame_bytes_max.
    """
    if offset >= file_bytes:
        return None
    if file_bytes - offset < _HEADER_BYTES:
        return _BadFrame(f"header cut short ({file_bytes - offset} of 8 bytes)", None)
    f.seek(offset)
    header = f.read(_HEADER_BYTES)
    if len(header) < _HEADER_BYTES:  # the file shrank under us
        return _BadFrame(f"header cut short ({len(header)} of 8 bytes)", None)
    length, crc = _HEADER.unpack(header)
    claimed_end = offset + _HEADER_BYTES + length
    if not 1 <= length <= limits.log_frame_bytes_max:
        return _BadFrame(f"frame length {length} outside 1..{limits.log_frame_bytes_max}", None)
    if claimed_end > file_bytes:
        present = file_bytes - offset - _HEADER_BYTES
        return _BadFrame(f"payload cut short ({present} of {length} bytes)", claimed_end)
    payload = f.read(length)
    if len(payload) != length:
        return _BadFrame(f"payload cut short ({len(payload)} of {length} bytes)", claimed_end)
    if google_crc32c.value(payload) != crc:
        return _BadFrame("CRC32C mismatch", claimed_end)
    return payload


def encode_frame(payload: bytes) -> bytes:
    """One frame: ``<II`` (length, crc32c) header + payload. Shared by log and checkpoints."""
    return _HEADER.pack(len(payload), google_crc32c.value(payload)) + payload


def frame_intact(frame: bytes) -> bool:
    """Whether ``frame`` is exactly one whole frame (``encode_frame``) whose CRC holds."""
    if len(frame) <= _HEADER_BYTES:
        return False
    length, crc = _HEADER.unpack_from(frame)
    payload = frame[_HEADER_BYTES:]
    return length == len(payload) and google_crc32c.value(payload) == crc


def iter_file_frames(f: BinaryIO, path: str | Path) -> Iterator[bytes]:
    """Every frame of a whole file (not a log segment: no torn-tail leniency).

    Raises LogCorruption (epoch = frame index) at the first bad frame. Checkpoint files
    use this: a checkpoint is valid only if every frame is.
    """
    file_bytes = os.fstat(f.fileno()).st_size
    offset, index = 0, 0
    while True:
        frame = _read_frame(f, offset, file_bytes)
        if frame is None:
            return
        if isinstance(frame, _BadFrame):
            raise LogCorruption(path, offset, index, frame.reason)
        yield frame
        offset += _HEADER_BYTES + len(frame)
        index += 1


def _all_zero(f: BinaryIO, start: int, end: int) -> bool:
    """Whether bytes [start, end) of f are all zero (vacuously true when start >= end)."""
    f.seek(start)
    position = start
    while position < end:
        chunk = f.read(min(_ZERO_SCAN_CHUNK_BYTES, end - position))
        if not chunk:
            return True
        if chunk.count(0) != len(chunk):
            return False
        position += len(chunk)
    return True


def _is_torn_tail(f: BinaryIO, offset: int, file_bytes: int, bad: _BadFrame) -> bool:
    """The torn-tail rule of the module docstring, for a bad frame of the last segment."""
    claimed_end = bad.claimed_end
    if claimed_end is None:
        claimed_end = offset + _HEADER_BYTES + limits.log_frame_bytes_max
    return _all_zero(f, claimed_end, file_bytes)


def _scan_segment(
    f: BinaryIO, path: Path, first_epoch: int, file_bytes: int, is_last: bool
) -> Iterator[tuple[int, int, bytes]]:
    """Yield (epoch, offset, payload) for each whole frame of one segment, in order.

    Stops quietly at a torn tail of the last segment; raises LogCorruption otherwise.
    """
    offset, epoch = 0, first_epoch
    while True:
        frame = _read_frame(f, offset, file_bytes)
        if frame is None:
            if offset == 0 and not is_last:
                raise LogCorruption(path, 0, epoch, "empty segment before the last one")
            return
        if isinstance(frame, _BadFrame):
            if not is_last:
                raise LogCorruption(path, offset, epoch, f"{frame.reason} in an earlier segment")
            if _is_torn_tail(f, offset, file_bytes, frame):
                return
            raise LogCorruption(path, offset, epoch, f"{frame.reason}, with data after it")
        yield epoch, offset, frame
        offset += _HEADER_BYTES + len(frame)
        epoch += 1


def iter_frames(
    log_dir: str | Path, first_epoch: int = 1, last_epoch: int | None = None
) -> Generator[tuple[int, bytes], None, None]:
    """Yield (epoch, payload) for first_epoch..last_epoch (inclusive, clipped), in order.

    Reads segment files sequentially, one frame in memory at a time, with no index. Stops
    at a torn tail exactly as recovery would, without modifying any file; raises
    LogCorruption for corruption in what it reads. Segments wholly before first_epoch are
    skipped unread. Sees only bytes a writer has flushed (a partial frame reads as torn).
    """
    listing = _list_segments(Path(log_dir))
    expected_epoch: int | None = None
    for i, (segment_first, path) in enumerate(listing):
        is_last = i == len(listing) - 1
        if last_epoch is not None and segment_first > last_epoch:
            return
        if not is_last and listing[i + 1][0] <= first_epoch:
            continue
        _check_segment_start(path, segment_first, expected_epoch)
        expected_epoch = segment_first
        with open(path, "rb") as f:
            file_bytes = os.fstat(f.fileno()).st_size
            for epoch, _offset, payload in _scan_segment(
                f, path, segment_first, file_bytes, is_last
            ):
                if last_epoch is not None and epoch > last_epoch:
                    return
                expected_epoch = epoch + 1
                if epoch >= first_epoch:
                    yield epoch, payload
                if last_epoch is not None and epoch >= last_epoch:
                    return


class CommandLog:
    """The command log of one sequencer: append, group-commit sync, indexed reads."""

    def __init__(
        self, log_dir: str | Path, *, fsync: bool = True, marker: bytes | None = MARKER
    ) -> None:
        self._dir = Path(log_dir)
        # Epochs whose payload contains ``marker`` (a deploy call's packed name: the
        # sequencer installs those batches' modules at start, txn_library.deployed),
        # found while recovery reads every frame anyway, and noted by the appender
        # (``mark``) for what it appends.
        self._marker = marker
        self.marked: list[int] = []
        self._fsync = fsync
        self._segments: list[_Segment] = []
        self._writer: BinaryIO | None = None  # appends to the last segment
        self._reader: tuple[Path, BinaryIO] | None = None  # last segment read from
        self._buffered = False  # appended bytes may sit in the writer's buffer
        self._unsynced = False  # appended bytes not yet fdatasynced
        self._dir_unsynced = False  # a segment file was created since the last dir fsync
        self._failed: BaseException | None = None
        self._closed = False
        self.recovered_truncated_bytes = 0
        self._dir.mkdir(parents=True, exist_ok=True)
        self._recover()

    # Properties -----------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def last_epoch(self) -> int:
        return self._segments[-1].last_epoch if self._segments else 0

    @property
    def first_epoch(self) -> int:
        if not self._segments or not self._segments[0].offsets:
            return 0
        return self._segments[0].first_epoch

    # Writing --------------------------------------------------------------------------
    def append(self, epoch: int, payload: bytes) -> None:
        """Buffer the frame of ``epoch`` (must be last_epoch + 1); durable after sync()."""
        self._check_usable()
        if epoch != self.last_epoch + 1:
            raise ValueError(
                f"append of epoch {epoch}: epochs are consecutive, expected {self.last_epoch + 1}"
            )
        if not isinstance(payload, bytes):
            payload = bytes(payload)  # google_crc32c takes read-only buffers only
        if not 1 <= len(payload) <= limits.log_frame_bytes_max:
            raise ValueError(
                f"payload of epoch {epoch} is {len(payload)} bytes, "
                f"allowed 1..{limits.log_frame_bytes_max}"
            )
        frame_bytes = _HEADER_BYTES + len(payload)
        tail = self._segments[-1] if self._segments else None
        if tail is None or (
            tail.offsets and tail.end_bytes + frame_bytes > limits.segment_bytes_max
        ):
            tail = self._roll(epoch)
        writer = self._writer_for(tail)
        header = _HEADER.pack(len(payload), google_crc32c.value(payload))
        with self._failing_on_error():
            writer.write(header)
            writer.write(payload)
        tail.offsets.append(tail.end_bytes)
        tail.end_bytes += frame_bytes
        self._buffered = self._unsynced = True

    def mark(self, epoch: int) -> None:
        """Note that the frame of ``epoch`` just appended holds the marker: the
        appender knows (it decoded the batch or built it), so appends never search."""
        invariant(epoch == self.last_epoch, f"mark of epoch {epoch}, last is {self.last_epoch}")
        if not self.marked or self.marked[-1] < epoch:
            self.marked.append(epoch)

    def start_at(self, epoch: int) -> None:
        """Make an empty log begin at ``epoch`` (its first append), as a pruned log does:
        a sequencer that copies a peer's log whose older segments were pruned."""
        self._check_usable()
        if self._segments:
            raise ValueError(f"start_at({epoch}) on a log that ends at {self.last_epoch}")
        if epoch < 1:
            raise ValueError(f"epochs start at 1, not {epoch}")
        self._roll(epoch)
        self.sync()

    def sync(self) -> None:
        """Make every appended frame durable: the group-commit point, once per epoch.

        Flushes and fdatasyncs the last segment, and fsyncs the directory if a segment
        file was created since the last sync. With fsync=False it only flushes.
        """
        self._check_usable()
        self._sync_writer()
        if self._dir_unsynced:
            self._sync_dir()
            self._dir_unsynced = False

    def delete_segments_before(self, epoch: int, archive_dir: Path | None = None) -> list[Path]:
        """Delete whole segments whose last epoch is below ``epoch``, never the last one.

        For an explicit retention command only. With ``archive_dir`` each segment is
        moved there (same file system or copied) instead of deleted. Returns the paths
        removed from the log directory.
        """
        self.sync()  # the surviving segment must be durable before older ones vanish
        deleted: list[Path] = []
        # Oldest first, so a crash part way leaves a contiguous suffix.
        while len(self._segments) > 1 and self._segments[0].last_epoch < epoch:
            segment = self._segments[0]
            if self._reader is not None and self._reader[0] == segment.path:
                self._reader[1].close()
                self._reader = None
            with self._failing_on_error():
                if archive_dir is not None:
                    import shutil

                    archive_dir.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(segment.path), str(archive_dir / segment.path.name))
                else:
                    segment.path.unlink()
            self._segments.pop(0)
            deleted.append(segment.path)
        if deleted:
            self._sync_dir()
            self.marked = [e for e in self.marked if e >= self.first_epoch]
        return deleted

    def close(self) -> None:
        """Sync (unless an earlier I/O error makes that pointless) and release files."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.sync()
        finally:
            self._closed = True
            handles = [self._writer] if self._writer is not None else []
            if self._reader is not None:
                handles.append(self._reader[1])
            self._writer = self._reader = None
            for handle in handles:
                try:
                    handle.close()
                except OSError:
                    if self._failed is None:
                        raise

    def __enter__(self) -> CommandLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # Reading --------------------------------------------------------------------------
    def read(self, epoch: int) -> bytes:
        """The payload of ``epoch``, synced or not; KeyError if it is not in the log."""
        self._check_usable()
        segment, index = self._locate(epoch)
        offset = segment.offsets[index]
        is_tail = index + 1 == len(segment.offsets)
        end = segment.end_bytes if is_tail else segment.offsets[index + 1]
        if segment is self._segments[-1] and self._buffered and self._writer is not None:
            with self._failing_on_error():
                self._writer.flush()
            self._buffered = False
        frame = _read_frame(self._reader_for(segment.path), offset, end)
        if frame is None:
            raise LogCorruption(segment.path, offset, epoch, "indexed frame is missing")
        if isinstance(frame, _BadFrame):
            raise LogCorruption(segment.path, offset, epoch, f"{frame.reason} (on read)")
        if offset + _HEADER_BYTES + len(frame) != end:
            raise LogCorruption(segment.path, offset, epoch, "frame length changed (on read)")
        return frame

    def read_range(self, first: int, last: int) -> list[tuple[int, bytes]]:
        """(epoch, payload) for first..last inclusive, clipped to the epochs on disk."""
        if self.first_epoch == 0:
            return []
        low, high = max(first, self.first_epoch), min(last, self.last_epoch)
        return [(epoch, self.read(epoch)) for epoch in range(low, high + 1)]

    def segments(self) -> list[tuple[int, int, Path]]:
        """(first_epoch, last_epoch, path) per segment, in order (empty: last = first - 1)."""
        return [(s.first_epoch, s.last_epoch, s.path) for s in self._segments]

    # Internals ------------------------------------------------------------------------
    def _recover(self) -> None:
        expected_epoch: int | None = None
        listing = _list_segments(self._dir)
        for i, (first_epoch, path) in enumerate(listing):
            _check_segment_start(path, first_epoch, expected_epoch)
            segment = self._recover_segment(first_epoch, path, i == len(listing) - 1)
            self._segments.append(segment)
            expected_epoch = segment.last_epoch + 1
        self._drop_empty_tail()
        if self._segments and self._fsync:
            # A process crash leaves frames in the page cache that recovery accepts.
            with open(self._segments[-1].path, "rb") as f:
                _fdatasync(f.fileno())
            self._sync_dir()

    def _recover_segment(self, first_epoch: int, path: Path, is_last: bool) -> _Segment:
        offsets: array[int] = array("Q")
        end_bytes = 0
        with open(path, "rb") as f:
            file_bytes = os.fstat(f.fileno()).st_size
            marker = self._marker
            for epoch, offset, payload in _scan_segment(f, path, first_epoch, file_bytes, is_last):
                offsets.append(offset)
                if marker is not None and marker in payload:
                    self.marked.append(epoch)
                end_bytes = offset + _HEADER_BYTES + len(payload)
        if end_bytes < file_bytes:  # only a torn tail gets here; corruption raised
            with open(path, "r+b") as f:
                f.truncate(end_bytes)
                if self._fsync:
                    os.fsync(f.fileno())
            self.recovered_truncated_bytes += file_bytes - end_bytes
        return _Segment(first_epoch, path, offsets, end_bytes)

    def _drop_empty_tail(self) -> None:
        if not self._segments or self._segments[-1].offsets:
            return
        tail = self._segments[-1]
        if len(self._segments) == 1 and tail.first_epoch > 1:
            return  # after pruning, its name is the only record of where epochs resume
        tail.path.unlink()
        self._segments.pop()
        self._sync_dir()

    def _roll(self, epoch: int) -> _Segment:
        if self._writer is not None:
            # The finished segment is durable before a later one exists.
            self._sync_writer()
            with self._failing_on_error():
                self._writer.close()
            self._writer = None
        segment = _Segment(epoch, self._dir / _segment_name(epoch), array("Q"), 0)
        with self._failing_on_error():
            self._writer = open(segment.path, "xb")  # held until roll or close
        self._segments.append(segment)
        self._dir_unsynced = True
        return segment

    def _writer_for(self, tail: _Segment) -> BinaryIO:
        if self._writer is None:
            with self._failing_on_error():
                self._writer = open(tail.path, "ab")  # held until roll or close
        return self._writer

    def _reader_for(self, path: Path) -> BinaryIO:
        if self._reader is not None and self._reader[0] == path:
            return self._reader[1]
        if self._reader is not None:
            self._reader[1].close()
        self._reader = None
        reader = open(path, "rb")  # cached until another segment is read
        self._reader = (path, reader)
        return reader

    def _locate(self, epoch: int) -> tuple[_Segment, int]:
        i = bisect.bisect_right(self._segments, epoch, key=lambda s: s.first_epoch) - 1
        if i < 0:
            raise KeyError(epoch)
        segment = self._segments[i]
        index = epoch - segment.first_epoch
        if index >= len(segment.offsets):
            raise KeyError(epoch)
        return segment, index

    def _sync_writer(self) -> None:
        if self._writer is None or not (self._unsynced or self._buffered):
            return
        with self._failing_on_error():
            self._writer.flush()
            if self._fsync:
                _fdatasync(self._writer.fileno())
        self._buffered = self._unsynced = False

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        with self._failing_on_error():
            fd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("command log is closed")
        if self._failed is not None:
            raise RuntimeError(
                "command log failed on an earlier I/O error; reopen it to recover"
            ) from self._failed

    @contextmanager
    def _failing_on_error(self) -> Iterator[None]:
        # After a failed write or fsync the file's state is unknown (and a retried fsync
        # can report success for lost pages), so the log refuses further use.
        try:
            yield
        except BaseException as err:
            self._failed = err
            raise


def rewrite_payloads(log_dir: str | Path, change: dict[int, bytes]) -> None:
    """Re-encode the whole log with the payloads of some epochs replaced: valid frames,
    valid CRCs. For tests and benchmarks that plant damage a CRC cannot see (never
    used by the engine; the batch digest chain is what finds such a change)."""
    log_dir = Path(log_dir)
    frames = [(e, change.get(e, p)) for e, p in iter_frames(log_dir)]
    for seg in log_dir.glob("segment-*.log"):
        seg.unlink()
    with CommandLog(log_dir, fsync=False) as log:
        for e, p in frames:
            log.append(e, p)
