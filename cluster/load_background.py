"""A load beside other work: a LoadGenerator on a thread of its own until stopped.

A benchmark that kills a leader while clients work (scripts/bench_ha.py), or floods a
cluster while a good client works (scripts/fuzz_cluster.py), starts the load, does its
work on its own thread, then stops the load and reads what it measured (the window, and
what its ``on_answer`` hook kept).

Invariants: the generator is built, run and closed on the background thread (it is not
thread-safe); after ``stop`` the source is never asked for another call; ``stop`` is
bounded by its ``timeout_s``, and an error of the run reaches its caller with its type.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cluster.load_shapes import CallLike, CallSource
from cluster.loadgen import LoadGenerator
from cluster.measure import Window


class Background:
    """A LoadGenerator built, run and closed on a thread of its own, until ``stop``.

    ``build(source)`` makes the generator on that thread (a generator stays on one). Its
    source is ``source`` until ``stop`` is called and None for every terminal after, so
    a closed loop's terminals finish as their calls are answered, and a run with
    ``duration_s`` None ends once nothing is outstanding (answered or timed out).
    ``stop`` waits for that and returns the window; an error of the run is raised there,
    on the caller's thread, with its type.
    """

    def __init__(self, build: Callable[[CallSource], LoadGenerator], source: CallSource) -> None:
        self._build = build
        self._source = source
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window: Window | None = None
        self._error: BaseException | None = None
        self.failovers = 0  # the generator's, once it has run
        self.malformed_replies = 0

    def start(self, **run: Any) -> None:
        """Start ``LoadGenerator.run(**run)`` on the thread."""
        self._thread = threading.Thread(
            target=self._main, args=(run,), name="ordo-load", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float) -> Window:
        """No more calls; wait up to ``timeout_s`` for the run to end; its window."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"the load did not drain within {timeout_s}s")
        if self._error is not None:
            raise self._error
        if self._window is None:
            raise RuntimeError("the load was never started")
        return self._window

    def _until_stopped(self, terminal: int) -> CallLike | None:
        return None if self._stop.is_set() else self._source(terminal)

    def _main(self, run: dict[str, Any]) -> None:
        try:
            with self._build(self._until_stopped) as gen:
                try:
                    self._window = gen.run(**run)
                finally:
                    self.failovers = gen.failovers
                    self.malformed_replies = gen.malformed_replies
        except BaseException as e:  # raised again by stop(), on the caller's thread
            self._error = e
