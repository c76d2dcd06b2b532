"""Tests for sequencer.log: roundtrip, segment rolling, retention, torn-tail recovery
versus corruption, the streaming reader, and recovery properties under random damage."""

from __future__ import annotations

import os
import pickle
import struct
import tempfile
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sequencer import log as log_module
from sequencer.log import CommandLog, LogCorruption, iter_frames
from txn_library import limits

HEADER_BYTES = 8


def payload_of(epoch: int, size: int = 40) -> bytes:
    """A distinct, non-zero payload per epoch."""
    unit = f"epoch-{epoch};".encode()
    return (unit * (size // len(unit) + 1))[:size]


def write_log(log_dir: Path, payloads: list[bytes], **kwargs: bool) -> None:
    with CommandLog(log_dir, **kwargs) as log:
        for epoch, payload in enumerate(payloads, start=1):
            log.append(epoch, payload)
            log.sync()


def frame_offset(payloads: list[bytes], index: int) -> int:
    """Byte offset of frame ``index`` in a single-segment log of ``payloads``."""
    return sum(HEADER_BYTES + len(p) for p in payloads[:index])


def only_segment(log_dir: Path) -> Path:
    (path,) = sorted(log_dir.glob("segment-*.log"))
    return path


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(limits, "segment_bytes_max", 200)
    return 200


# Roundtrip -------------------------------------------------------------------------------
def test_roundtrip_and_reopen(tmp_path: Path) -> None:
    payloads = [payload_of(e, 10 + e) for e in range(1, 21)]
    with CommandLog(tmp_path) as log:
        assert (log.first_epoch, log.last_epoch) == (0, 0)
        for epoch, payload in enumerate(payloads, start=1):
            log.append(epoch, payload)
            log.sync()
        assert log.last_epoch == 20
        assert log.read(7) == payloads[6]
    with CommandLog(tmp_path) as log:
        assert (log.first_epoch, log.last_epoch) == (1, 20)
        assert log.recovered_truncated_bytes == 0
        assert [log.read(e) for e in range(1, 21)] == payloads
        log.append(21, b"next")
    with CommandLog(tmp_path) as log:
        assert log.read(21) == b"next"


def test_file_holds_the_documented_frame_format(tmp_path: Path) -> None:
    write_log(tmp_path, [b"hello", b"world!"])
    data = only_segment(tmp_path).read_bytes()
    assert only_segment(tmp_path).name == "segment-000000000001.log"
    expected = b"".join(
        struct.pack("<II", len(p), google_crc32c.value(p)) + p for p in (b"hello", b"world!")
    )
    assert data == expected


@pytest.mark.parametrize("epoch", [0, 2, -1])
def test_first_append_must_be_epoch_1(tmp_path: Path, epoch: int) -> None:
    with CommandLog(tmp_path, fsync=False) as log, pytest.raises(ValueError, match="expected 1"):
        log.append(epoch, b"x")


@pytest.mark.parametrize("epoch", [3, 5, 1])
def test_append_rejects_non_consecutive_epoch(tmp_path: Path, epoch: int) -> None:
    with CommandLog(tmp_path, fsync=False) as log:
        log.append(1, b"a")
        log.append(2, b"b")
        if epoch == 3:
            log.append(3, b"c")
            assert log.last_epoch == 3
            return
        with pytest.raises(ValueError, match="expected 3"):
            log.append(epoch, b"x")
        assert log.last_epoch == 2


def test_append_rejects_empty_and_oversized_payloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "log_frame_bytes_max", 64)
    with CommandLog(tmp_path, fsync=False) as log:
        with pytest.raises(ValueError, match="0 bytes"):
            log.append(1, b"")
        with pytest.raises(ValueError, match="65 bytes"):
            log.append(1, b"x" * 65)
        log.append(1, bytearray(b"x" * 64))
        assert log.read(1) == b"x" * 64


def test_read_sees_unsynced_appends_and_missing_epochs_raise(tmp_path: Path) -> None:
    with CommandLog(tmp_path, fsync=False) as log:
        log.append(1, b"one")
        assert log.read(1) == b"one"
        log.append(2, b"two")
        assert log.read_range(1, 2) == [(1, b"one"), (2, b"two")]
        for missing in (0, 3, -5):
            with pytest.raises(KeyError):
                log.read(missing)
        assert log.read_range(-10, 10) == [(1, b"one"), (2, b"two")]
        assert log.read_range(3, 10) == []


def test_closed_log_refuses_use(tmp_path: Path) -> None:
    log = CommandLog(tmp_path)
    log.close()
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.append(1, b"x")


def test_sync_is_one_fdatasync_and_a_dir_fsync_after_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_segments: int
) -> None:
    datasyncs: list[int] = []
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(log_module, "_fdatasync", lambda fd: datasyncs.append(fd))
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    with CommandLog(tmp_path) as log:
        log.append(1, payload_of(1))
        log.sync()
        assert (len(datasyncs), len(fsyncs)) == (1, 1)  # new segment: its directory entry
        log.append(2, payload_of(2))
        log.sync()
        assert (len(datasyncs), len(fsyncs)) == (2, 1)
        log.sync()  # nothing appended: nothing to do
        assert (len(datasyncs), len(fsyncs)) == (2, 1)


# Segments and retention -----------------------------------------------------------------
def test_segments_roll_and_reads_cross_them(tmp_path: Path, small_segments: int) -> None:
    payloads = [payload_of(e, 40) for e in range(1, 13)]  # 48-byte frames: 4 per segment
    payloads.append(payload_of(13, 500))  # larger than a segment: alone in its own
    payloads.append(payload_of(14, 40))
    write_log(tmp_path, payloads, fsync=False)
    with CommandLog(tmp_path, fsync=False) as log:
        listing = log.segments()
        assert [(first, last) for first, last, _ in listing] == [
            (1, 4),
            (5, 8),
            (9, 12),
            (13, 13),
            (14, 14),
        ]
        assert [path.name for _, _, path in listing][:2] == [
            "segment-000000000001.log",
            "segment-000000000005.log",
        ]
        assert all(path.stat().st_size <= small_segments for _, _, path in listing[:3])
        assert log.read_range(3, 14) == list(enumerate(payloads, start=1))[2:]
        assert log.read(13) == payloads[12]
        log.append(15, payload_of(15))
        assert log.segments()[-1][:2] == (14, 15)


def test_delete_segments_before_keeps_the_current_segment(
    tmp_path: Path, small_segments: int
) -> None:
    payloads = [payload_of(e, 40) for e in range(1, 11)]  # segments 1-4, 5-8, 9-10
    write_log(tmp_path, payloads)
    with CommandLog(tmp_path) as log:
        assert log.delete_segments_before(5) == [tmp_path / "segment-000000000001.log"]
        assert log.first_epoch == 5
        with pytest.raises(KeyError):
            log.read(4)
        deleted = log.delete_segments_before(1_000)
        assert deleted == [tmp_path / "segment-000000000005.log"]
        assert [(f, last) for f, last, _ in log.segments()] == [(9, 10)]
        assert log.read_range(1, 100) == [(9, payloads[8]), (10, payloads[9])]
        log.append(11, b"eleven")
    with CommandLog(tmp_path) as log:
        assert (log.first_epoch, log.last_epoch) == (9, 11)
        assert list(iter_frames(tmp_path)) == log.read_range(1, 11)


# Torn tail ------------------------------------------------------------------------------
def test_payload_cut_short_is_recovered_and_appending_continues(tmp_path: Path) -> None:
    payloads = [payload_of(e) for e in range(1, 6)]
    write_log(tmp_path, payloads)
    segment = only_segment(tmp_path)
    whole_bytes = segment.stat().st_size
    os.truncate(segment, whole_bytes - 5)
    with CommandLog(tmp_path) as log:
        assert log.last_epoch == 4
        assert log.recovered_truncated_bytes == HEADER_BYTES + len(payloads[4]) - 5
        assert segment.stat().st_size == frame_offset(payloads, 4)
        assert log.read_range(1, 10) == list(enumerate(payloads[:4], start=1))
        log.append(5, b"retried epoch 5")
        log.sync()
    with CommandLog(tmp_path) as log:
        assert log.recovered_truncated_bytes == 0
        assert log.read(5) == b"retried epoch 5"


@pytest.mark.parametrize("header_bytes_left", [0, 1, 7])
def test_header_cut_short_is_recovered(tmp_path: Path, header_bytes_left: int) -> None:
    payloads = [payload_of(e) for e in range(1, 4)]
    write_log(tmp_path, payloads)
    segment = only_segment(tmp_path)
    with open(segment, "ab") as f:
        f.write(struct.pack("<II", 40, 0)[:header_bytes_left])
    with CommandLog(tmp_path) as log:
        assert log.last_epoch == 3
        assert log.recovered_truncated_bytes == header_bytes_left
        log.append(4, b"four")


def damage_last_frame(mode: str, segment: Path, offset: int) -> None:
    if mode == "flipped payload byte":
        flip_byte(segment, offset + HEADER_BYTES + 3)
    elif mode == "flipped crc byte":
        flip_byte(segment, offset + 5)
    elif mode == "absurd length":
        overwrite(segment, offset, struct.pack("<I", 0xFFFF_FFFF))
    elif mode == "zeroed header":
        overwrite(segment, offset, bytes(HEADER_BYTES))
    elif mode == "zeroed payload, zero fill after":
        with open(segment, "r+b") as f:
            f.seek(offset + HEADER_BYTES)
            f.write(bytes(os.path.getsize(segment) - offset - HEADER_BYTES + 4096))
    else:
        raise AssertionError(mode)


@pytest.mark.parametrize(
    "mode",
    [
        "flipped payload byte",
        "flipped crc byte",
        "absurd length",
        "zeroed header",
        "zeroed payload, zero fill after",
    ],
)
def test_bad_last_frame_is_recovered_to_the_previous_frame(tmp_path: Path, mode: str) -> None:
    payloads = [payload_of(e) for e in range(1, 6)]
    write_log(tmp_path, payloads)
    segment = only_segment(tmp_path)
    damage_last_frame(mode, segment, frame_offset(payloads, 4))
    assert list(iter_frames(tmp_path)) == list(enumerate(payloads[:4], start=1))
    with CommandLog(tmp_path) as log:
        assert log.last_epoch == 4
        assert log.recovered_truncated_bytes > 0
        assert segment.stat().st_size == frame_offset(payloads, 4)
        assert log.read(4) == payloads[3]


def test_zero_fill_after_whole_frames_is_recovered(tmp_path: Path) -> None:
    payloads = [payload_of(e) for e in range(1, 4)]
    write_log(tmp_path, payloads)
    with open(only_segment(tmp_path), "ab") as f:
        f.write(bytes(10_000))
    with CommandLog(tmp_path) as log:
        assert (log.last_epoch, log.recovered_truncated_bytes) == (3, 10_000)


def test_torn_only_frame_of_last_segment_removes_the_file(
    tmp_path: Path, small_segments: int
) -> None:
    payloads = [payload_of(e, 40) for e in range(1, 6)]  # segments 1-4 and 5
    write_log(tmp_path, payloads)
    last = tmp_path / "segment-000000000005.log"
    os.truncate(last, 10)
    with CommandLog(tmp_path) as log:
        assert log.last_epoch == 4
        assert not last.exists()
        assert [(f, e) for f, e, _ in log.segments()] == [(1, 4)]
        log.append(5, b"again")  # fits in segment 1 only if it has room; else rolls
        assert log.read(5) == b"again"


def test_empty_trailing_segment_file_is_removed(tmp_path: Path) -> None:
    write_log(tmp_path, [b"a", b"b"])
    (tmp_path / "segment-000000000003.log").touch()
    with CommandLog(tmp_path) as log:
        assert log.last_epoch == 2
        assert not (tmp_path / "segment-000000000003.log").exists()


def test_pruned_log_keeps_its_epoch_base_when_its_only_frame_is_torn(
    tmp_path: Path, small_segments: int
) -> None:
    payloads = [payload_of(e, 40) for e in range(1, 6)]  # segments 1-4 and 5
    write_log(tmp_path, payloads)
    with CommandLog(tmp_path) as log:
        log.delete_segments_before(5)
    only = only_segment(tmp_path)
    os.truncate(only, 20)
    with CommandLog(tmp_path) as log:
        assert (log.first_epoch, log.last_epoch) == (0, 4)
        assert only.exists() and only.stat().st_size == 0
        with pytest.raises(ValueError, match="expected 5"):
            log.append(1, b"restart from 1")
        log.append(5, b"five")
    with CommandLog(tmp_path) as log:
        assert log.read_range(1, 10) == [(5, b"five")]


# Corruption -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["flipped payload byte", "flipped crc byte", "shorter length"])
def test_bad_middle_frame_raises(tmp_path: Path, mode: str) -> None:
    payloads = [payload_of(e) for e in range(1, 8)]
    write_log(tmp_path, payloads)
    segment = only_segment(tmp_path)
    offset = frame_offset(payloads, 2)  # epoch 3
    before = segment.read_bytes()
    if mode == "shorter length":
        overwrite(segment, offset, struct.pack("<I", len(payloads[2]) - 1))
    else:
        damage_last_frame(mode, segment, offset)
    with pytest.raises(LogCorruption) as raised:
        CommandLog(tmp_path)
    error = raised.value
    assert (error.path, error.offset, error.epoch) == (segment, offset, 3)
    assert "epoch 3" in str(error) and segment.name in str(error) and str(offset) in str(error)
    with pytest.raises(LogCorruption, match="epoch 3"):
        list(iter_frames(tmp_path))
    assert len(segment.read_bytes()) == len(before)  # nothing was cut


@pytest.mark.parametrize("header", [struct.pack("<I", 10_000), bytes(HEADER_BYTES)])
def test_unusable_length_with_more_than_one_frame_after_it_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, header: bytes
) -> None:
    # With no usable length the torn frame may reach one maximal frame (8 + 64 bytes)
    # from its start; non-zero bytes beyond that are later frames, so this is corruption.
    monkeypatch.setattr(limits, "log_frame_bytes_max", 64)
    payloads = [payload_of(e) for e in range(1, 8)]  # 48-byte frames
    write_log(tmp_path, payloads)
    overwrite(only_segment(tmp_path), frame_offset(payloads, 3), header)
    with pytest.raises(LogCorruption, match="epoch 4"):
        CommandLog(tmp_path)


def test_unusable_length_within_one_frame_of_eof_is_torn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "log_frame_bytes_max", 64)
    payloads = [payload_of(e) for e in range(1, 8)]
    write_log(tmp_path, payloads)
    overwrite(only_segment(tmp_path), frame_offset(payloads, 6), bytes(HEADER_BYTES))
    with CommandLog(tmp_path) as log:
        assert (log.last_epoch, log.recovered_truncated_bytes) == (6, 48)


def test_bad_frame_in_earlier_segment_raises(tmp_path: Path, small_segments: int) -> None:
    payloads = [payload_of(e, 40) for e in range(1, 10)]  # segments 1-4, 5-8, 9
    write_log(tmp_path, payloads)
    middle = tmp_path / "segment-000000000005.log"
    os.truncate(middle, middle.stat().st_size - 3)  # a torn tail, but not in the last segment
    with pytest.raises(LogCorruption, match="epoch 8") as raised:
        CommandLog(tmp_path)
    assert raised.value.path == middle
    with pytest.raises(LogCorruption, match="epoch 8"):
        list(iter_frames(tmp_path))


def test_missing_segment_raises(tmp_path: Path, small_segments: int) -> None:
    payloads = [payload_of(e, 40) for e in range(1, 10)]
    write_log(tmp_path, payloads)
    (tmp_path / "segment-000000000005.log").unlink()
    with pytest.raises(LogCorruption, match="previous segment ends at epoch 4"):
        CommandLog(tmp_path)
    with pytest.raises(LogCorruption, match="previous segment ends at epoch 4"):
        list(iter_frames(tmp_path))


def test_log_corruption_survives_pickling() -> None:
    error = LogCorruption(Path("/x/segment-000000000001.log"), 96, 3, "CRC32C mismatch")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.offset, copy.epoch, str(copy)) == (
        error.path,
        error.offset,
        error.epoch,
        str(error),
    )


# Streaming reader -----------------------------------------------------------------------
def test_iter_frames_matches_read_range_and_honours_bounds(
    tmp_path: Path, small_segments: int
) -> None:
    payloads = [payload_of(e, 20 + e) for e in range(1, 16)]
    write_log(tmp_path, payloads)
    with CommandLog(tmp_path) as log:
        assert list(iter_frames(tmp_path)) == log.read_range(1, 15)
        for first, last in [(1, 15), (4, 9), (6, 6), (10, None), (14, 99), (9, 3)]:
            expected = log.read_range(first, 99 if last is None else last)
            assert list(iter_frames(tmp_path, first, last)) == expected


def test_iter_frames_stops_at_torn_tail_without_modifying(tmp_path: Path) -> None:
    payloads = [payload_of(e) for e in range(1, 5)]
    write_log(tmp_path, payloads)
    segment = only_segment(tmp_path)
    os.truncate(segment, segment.stat().st_size - 1)
    size = segment.stat().st_size
    assert list(iter_frames(tmp_path)) == list(enumerate(payloads[:3], start=1))
    assert segment.stat().st_size == size


def test_iter_frames_of_empty_directory_yields_nothing(tmp_path: Path) -> None:
    assert list(iter_frames(tmp_path)) == []


# Properties -----------------------------------------------------------------------------
PROPERTY_SETTINGS = settings(
    max_examples=75,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY_SETTINGS
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=25),
    segment_bytes=st.integers(16, 1_000),
    data=st.data(),
)
def test_any_cut_of_the_last_segment_recovers_a_prefix(
    sizes: list[int], segment_bytes: int, data: st.DataObject
) -> None:
    payloads = [payload_of(e, size) for e, size in enumerate(sizes, start=1)]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "segment_bytes_max", segment_bytes)
        log_dir = Path(tmp)
        write_log(log_dir, payloads, fsync=False)
        last_segment = sorted(log_dir.glob("segment-*.log"))[-1]
        cut = data.draw(st.integers(0, last_segment.stat().st_size), label="cut")
        os.truncate(last_segment, cut)
        streamed = list(iter_frames(log_dir))
        with CommandLog(log_dir, fsync=False) as log:
            recovered = log.read_range(1, len(payloads))
            epochs_before_last = int(last_segment.name[8:20]) - 1
            assert log.last_epoch >= epochs_before_last
            assert recovered == list(enumerate(payloads[: log.last_epoch], start=1))
            assert streamed == recovered
            log.append(log.last_epoch + 1, b"after recovery")


@PROPERTY_SETTINGS
@given(
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=15),
    segment_bytes=st.integers(16, 400),
    data=st.data(),
)
def test_any_flipped_byte_is_reported_or_cut_never_returned(
    sizes: list[int], segment_bytes: int, data: st.DataObject
) -> None:
    payloads = [payload_of(e, size) for e, size in enumerate(sizes, start=1)]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "segment_bytes_max", segment_bytes)
        log_dir = Path(tmp)
        write_log(log_dir, payloads, fsync=False)
        segments = sorted(log_dir.glob("segment-*.log"))
        segment = data.draw(st.sampled_from(segments), label="segment")
        flip_byte(segment, data.draw(st.integers(0, segment.stat().st_size - 1), label="at"))
        try:
            log = CommandLog(log_dir, fsync=False)
        except LogCorruption:
            with pytest.raises(LogCorruption):
                list(iter_frames(log_dir))
            return
        with log:
            assert segment == segments[-1]  # only damage to the last segment is cut
            recovered = log.read_range(1, len(payloads))
            assert log.last_epoch < len(payloads)
            assert recovered == list(enumerate(payloads[: log.last_epoch], start=1))
