"""A real CommandLog (segment files in a temp directory) that can crash like a disk.

The simulated sequencer writes through the very ``sequencer.log.CommandLog`` a live one
uses (with ``fsync=False``: the simulator, not the kernel, decides what survives).
After every ``sync`` the size of each segment file is recorded as *durable*. A crash
(``crash``) then leaves on disk exactly what a real one may leave:

- every synced byte;
- of the bytes appended after the last sync, a random prefix (possibly none, possibly
  all: a process crash keeps what reached the page cache), optionally followed by
  zeros (a file extended by blocks whose data never landed). So the last frame may be
  missing, whole, or torn.

The next incarnation opens the same directory with a new ``SimCommandLog``, whose
recovery (the real one) truncates the torn tail.

Crash points inside a call: with ``crash_in_sync`` set, the next ``sync`` raises
``SimulatedCrash`` instead of syncing, i.e. the process dies between writing a
batch's frame and making it durable (so it was never published). With
``fail_sync`` set, the next ``sync`` raises OSError (EIO), as a failing disk does, and
the log refuses further use exactly as after a real failed sync: the sequencer must
fail-stop.

Planted bug ``lose_synced``: a disk that acknowledges fsync but loses the last
synced frame on a crash (a durability violation the checks must catch).
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

from sequencer.log import CommandLog


class SimulatedCrash(Exception):
    """The simulated process dies here; the simulator catches it and crashes the node."""


class SimCommandLog(CommandLog):
    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, fsync=False)
        self.crash_in_sync = False
        self.fail_sync = False
        self._crashing = False
        self._durable: dict[Path, int] = {}
        self._durable_before: dict[Path, int] = {}
        self._record_durable()

    def sync(self) -> None:
        if self._crashing:
            super().sync()
            return
        if self.crash_in_sync:
            self.crash_in_sync = False
            raise SimulatedCrash("sequencer crashed between append and sync")
        if self.fail_sync:
            self.fail_sync = False
            err = OSError(errno.EIO, "simulated fdatasync failure")
            self._failed = err  # what CommandLog._failing_on_error keeps after a failed sync
            raise err
        super().sync()
        self._record_durable()

    def _record_durable(self) -> None:
        self._durable_before = self._durable
        self._durable = {path: path.stat().st_size for _f, _l, path in self.segments()}

    def crash(self, rng: random.Random, lose_synced: bool = False) -> str:
        """Close the files and cut them back to what the crash leaves; returns what
        happened to the tail, for the trace."""
        self._crashing = True
        self.close()  # flushes Python's buffers: the file now holds every appended byte
        durable = self._durable_before if lose_synced else self._durable
        what = []
        for _first, _last, path in self.segments():
            size = path.stat().st_size
            kept = durable.get(path, 0)
            unsynced = size - kept
            torn = zeros = 0
            if unsynced > 0 and not lose_synced:
                torn = rng.randint(0, unsynced)
                zeros = rng.choice((0, 0, 0, rng.randint(1, 64)))
            with open(path, "r+b") as f:
                f.truncate(kept + torn)
                if zeros:
                    f.seek(0, os.SEEK_END)
                    f.write(b"\0" * zeros)
            if unsynced or zeros:
                what.append(f"{path.name}: {unsynced} unsynced, kept {torn} + {zeros} zeros")
        return "; ".join(what) or "clean"
