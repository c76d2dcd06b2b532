"""Checking a module to deploy in a process of its own (the sequencer's DeployChecker).

The sequencer never imports a module it was sent before this process has: a module
that raises, loops forever or eats memory at import, registers a table, a stream, a
window, a dataflow or a trigger, or a procedure name owned by a module named at
start-up, is refused with the reason (sequencer.deploys), and the sequencer's loop
goes on meanwhile. ``SubprocessChecker.submit`` starts a thread that runs ``python -m
cluster.deploy_check`` with the cluster's procedure modules, the deploys already
installed and the module on stdin (msgpack), with ``deploy_check_memory_bytes_max`` of
address space. The child gives the module's import ``limits.deploy_check_timeout_s``
(an alarm: a loop at import is refused); the parent kills a child still running
``_STARTUP_S`` after that (a loop an alarm cannot stop). The verdict is the exit
status (0: accepted) and the child's last line of output (the reason).

Invariant: ``take_done`` returns each submitted token exactly once.
"""

from __future__ import annotations

import queue
import resource
import signal
import subprocess
import sys
import threading

import msgpack

from txn_library import deployed, limits
from txn_library.procedure import load_modules

_REFUSED = 3  # exit status of a refused module (anything else non-zero: it crashed)
_STARTUP_S = 30.0  # the child's interpreter and imports, on a loaded machine


class SubprocessChecker:
    def __init__(self, procedure_modules: tuple[str, ...]) -> None:
        self.procedure_modules = procedure_modules
        self._done: queue.SimpleQueue[tuple[int, str | None]] = queue.SimpleQueue()

    def submit(self, token: int, module: str, source: bytes, retire: tuple[str, ...]) -> None:
        request = msgpack.packb(
            [
                limits.deploy_check_timeout_s,
                list(self.procedure_modules),
                [r.encode() for r in deployed.installed()],
                module,
                source,
                list(retire),
            ]
        )
        threading.Thread(
            target=self._run, args=(token, module, request), name="deploy-check", daemon=True
        ).start()

    def take_done(self) -> list[tuple[int, str | None]]:
        out = []
        while not self._done.empty():
            out.append(self._done.get_nowait())
        return out

    def _run(self, token: int, module: str, request: bytes) -> None:
        try:
            self._done.put((token, _check_in_child(module, request)))
        except Exception as e:  # noqa: BLE001 - an answer is owed whatever happened
            self._done.put((token, f"{module}: the check could not run ({e})"))


def _limit_memory() -> None:
    cap = limits.deploy_check_memory_bytes_max
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _check_in_child(module: str, request: bytes) -> str | None:
    # The child bounds the module's import itself (an alarm); this bound is for what
    # an alarm cannot stop (a loop in C) and includes the child's own start-up.
    timeout = limits.deploy_check_timeout_s + _STARTUP_S
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cluster.deploy_check"],
            input=request,
            capture_output=True,
            timeout=timeout,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        return f"{module}: the checking process still ran after {timeout:g} s; killed"
    if done.returncode == 0:
        return None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode == _REFUSED and lines:
        return lines[-1]
    err = done.stderr.decode(errors="replace").strip().splitlines()
    tail = err[-1] if err else f"exit status {done.returncode}"
    return f"{module}: the checking process died importing it ({tail[:300]})"


def main() -> None:
    """The child: install what the cluster runs, then check the module."""
    timeout, modules, installed, module, source, retire = msgpack.unpackb(sys.stdin.buffer.read())
    load_modules(modules)
    for data in installed:
        deployed.install(deployed.Deploy.decode(data))
    before = _stream_shapes()

    def too_long(_sig: int, _frame: object) -> None:
        raise TimeoutError(f"still importing after {timeout:g} s (a loop at import?)")

    signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        procs = deployed.check(module, source, retire)
        signal.setitimer(signal.ITIMER_REAL, 0)
        if _stream_shapes() != before:
            raise deployed.DeployRefused(
                f"{module}: registers streams, windows, dataflows or triggers: a deployed "
                "module registers procedures only"
            )
    except deployed.DeployRefused as e:
        print(str(e).replace("\n", " "), flush=True)
        sys.exit(_REFUSED)
    print(f"ok: {sorted(procs)}", flush=True)


def _stream_shapes() -> tuple[int, ...]:
    from txn_library.streams import context, dataflow, spec

    return (
        len(spec.streams()),
        len(spec.windows()),
        len(dataflow.dataflows()),
        sum(len(v) for v in context._TRIGGERS.values()),
    )


if __name__ == "__main__":
    main()
