"""What a checkpoint load's per-row steps cost on their own, on one base file's rows:
decoding its frames (msgpack, and msgspec's typed decoder), hashing the decoded keys,
and building the per-table dicts from them.

    .venv/bin/python results/checkpoint_load_s12/floor.py BASE_CHECKPOINT_FILE
"""

import gc
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import msgspec  # noqa: E402

from sequencer.log import iter_file_frames  # noqa: E402

Decoded = list[tuple[str, tuple, tuple, tuple]]
TYPED = msgspec.msgpack.Decoder(
    tuple[str, tuple[tuple[Any, ...], ...], tuple[int, ...], tuple[bytes, ...]]
)


def by_msgpack(frames: list[bytes]) -> Decoded:
    return [msgpack.unpackb(memoryview(x)[1:], use_list=False) for x in frames]


def by_msgspec(frames: list[bytes]) -> Decoded:
    return [TYPED.decode(memoryview(x)[1:]) for x in frames]


def hashes(dec: Decoded) -> list[int]:
    return [hash(k) for d in dec for k in d[1]]


def dicts(dec: Decoded) -> dict[str, dict]:
    tables: dict[str, dict] = {}
    for table, keys, _deleted, encodings in dec:
        tables.setdefault(table, {}).update(zip(keys, encodings, strict=True))
    return tables


def main() -> None:
    path = Path(sys.argv[1])
    with open(path, "rb") as f:
        frames = [x for x in iter_file_frames(f, path) if x[:1] == b"R"]
    gc.disable()
    for _ in range(2):
        for what, fn in (("decode, msgpack", by_msgpack), ("decode, msgspec typed", by_msgspec)):
            t = time.perf_counter()
            dec = fn(frames)
            print(f"{what}: {time.perf_counter() - t:.3f} s")
        rows = sum(len(d[1]) for d in dec)
        for what, step in ((f"hash() of {rows} keys", hashes), ("dicts from them", dicts)):
            t = time.perf_counter()
            step(dec)
            print(f"{what}: {time.perf_counter() - t:.3f} s")
        del dec


main()
