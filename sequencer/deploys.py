"""The sequencer's part of a deploy: from the call to the batch that installs it.

An ``ordo.deploy`` call (txn_library.deployed) is not queued like other calls when it
is accepted. Its module goes to a ``DeployChecker`` first: the live sequencer's runs
a separate process (cluster.deploy_check) that imports the module and checks what it
registers, so a module that raises, loops or registers a built-in name is refused
and this process never runs it; the simulator and unit tests check in process
(``InlineChecker``). A refused module's call is answered ``deploy_refused`` with the
reason; a checked one is queued for the next batch like any call, and the batch that
holds it carries FLAG_DEPLOY.

Once that batch is in the log (epoch E), the sequencer installs the module (its
procedures are then the ones new calls are validated against) and checks again the
calls still waiting for a batch whose procedure it changed: they were validated
against the old version, and will run at E + 1 or later with the new one, so each is
validated against the new version and its participants computed again (a call the new
version refuses, or a retired procedure's, is answered with the error).

At start, a sequencer installs every deploy its log holds (``CommandLog.marked``)
and what it kept of pruned segments (``CodeStore`` beside the log).

Invariants:
- At most one deploy is being checked or waiting for a batch at a time (another gets
  ``overloaded``), so deploys are logged in the order they were accepted.
- Every call in a batch of epoch >= E + 1 was validated, and its participants
  computed, against the versions in force from E + 1 (the versions a partition runs
  it with); every call in a batch <= E against the older ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sequencer.calls import PendingCall, participants
from sequencer.fair import FairQueues
from sequencer.log import CommandLog
from sequencer.retry_cache import RetryCache
from txn_library import deployed
from txn_library.deployed import DEPLOY_PROC, CodeStore, Deploy, DeployRefused
from txn_library.errors import (
    ERR_OVERLOADED,
    ERR_UNAVAILABLE,
    ERROR,
    BadRequest,
    invariant,
)
from txn_library.procedure import lookup
from txn_library.wire.sequencer import FLAG_DEPLOY, decode_batch


class DeployChecker(Protocol):
    """Imports and checks a module away from the sequencer's loop (``deployed.check``),
    answering later through ``take_done``: (token, None) or (token, the reason)."""

    def submit(self, token: int, module: str, source: bytes, retire: tuple[str, ...]) -> None: ...

    def take_done(self) -> list[tuple[int, str | None]]: ...


class InlineChecker:
    """Checks in this process, at once (the simulator, unit tests)."""

    def __init__(self) -> None:
        self._done: list[tuple[int, str | None]] = []

    def submit(self, token: int, module: str, source: bytes, retire: tuple[str, ...]) -> None:
        try:
            deployed.check(module, source, retire)
        except DeployRefused as e:
            self._done.append((token, str(e)))
        else:
            self._done.append((token, None))

    def take_done(self) -> list[tuple[int, str | None]]:
        done, self._done = self._done, []
        return done


def install_logged(command_log: Any) -> int:
    """Install every deploy the local log holds and what its code store kept of pruned
    segments; how many records were new."""
    local: CommandLog = getattr(command_log, "local", command_log)  # a ReplicatedLog's own
    n = code_store(local).install_all()
    for epoch in local.marked:
        batch = decode_batch(local.read(epoch))
        if batch.flags & FLAG_DEPLOY:
            n += sum(deployed.install(r) for r in deployed.records_in_batch(epoch, batch.txns))
    return n


def code_store(local: CommandLog) -> CodeStore:
    return CodeStore(Path(local.directory) / "deploys")


def keep_before_prune(command_log: Any) -> None:
    """Save the deploys of the log's batches to its code store (before segments go)."""
    local: CommandLog = getattr(command_log, "local", command_log)
    records: list[Deploy] = []
    for epoch in local.marked:
        batch = decode_batch(local.read(epoch))
        if batch.flags & FLAG_DEPLOY:
            records += deployed.records_in_batch(epoch, batch.txns)
    code_store(local).save(records)


class Deploys:
    def __init__(
        self,
        checker: DeployChecker | None,
        pending: FairQueues[PendingCall],
        retries: RetryCache,
        reply: Callable[..., None],
        enqueue: Callable[[PendingCall, bytes | None], None],
        *,
        partitions: int,
    ) -> None:
        self.checker = checker
        self._pending = pending
        self.retries = retries
        self._reply = reply
        self._enqueue = enqueue
        self.partitions = partitions
        self._checking: dict[int, tuple[PendingCall, bytes]] = {}
        # Checked and queued for a batch: each call with its module, source and retired
        # names (a logged call's arguments are dropped: sequencer.epochs).
        self.waiting: list[tuple[PendingCall, tuple[str, bytes, tuple[str, ...]]]] = []
        self._tokens = 0

    def submit(self, call: PendingCall, body: bytes) -> None:
        """Send an accepted deploy call's module to the checker (BadRequest: none here,
        or another deploy in progress)."""
        if self.checker is None:
            raise BadRequest(ERR_UNAVAILABLE, "this sequencer cannot check modules to deploy")
        if self._checking or self.waiting:
            raise BadRequest(ERR_OVERLOADED, "a deploy is in progress; retry once it is answered")
        module, source, retire = call.args
        if not all(type(n) is str for n in retire):
            raise BadRequest("bad_arguments", "retire: a list of procedure names")
        self._tokens += 1
        self._checking[self._tokens] = (call, body)
        self.checker.submit(self._tokens, module, bytes(source), tuple(retire))

    def poll(self) -> None:
        """Take the checker's answers: refuse, or queue the call for the next batch."""
        if self.checker is None or not self._checking:
            return
        for token, problem in self.checker.take_done():
            entry = self._checking.pop(token, None)
            if entry is None:
                continue
            call, body = entry
            if problem is not None:
                self._refuse(call, deployed.ERR_DEPLOY_REFUSED, problem)
                continue
            call.participants = participants(DEPLOY_PROC, call.args, self.partitions)
            try:
                self._enqueue(call, body)
            except BadRequest as e:
                self._refuse(call, e.code, e.message)
                continue
            module, source, retire = call.args
            self.waiting.append((call, (module, bytes(source), tuple(retire))))

    def in_batch(self, calls: list[PendingCall]) -> list[PendingCall]:
        """The deploy calls among a batch's calls (none: a cheap check)."""
        if not self.waiting:
            return []
        waiting = {id(c) for c, _ in self.waiting}
        return [c for c in calls if id(c) in waiting]

    def logged(self, epoch: int, calls: list[PendingCall]) -> None:
        """The batch of ``epoch`` holding ``calls`` (deploys) is in the log: install
        them and check again the waiting calls of the procedures they change."""
        changed: set[str] = set()
        logged = {id(c) for c in calls}
        for _call, (module, source, retire) in [w for w in self.waiting if id(w[0]) in logged]:
            record = Deploy(module, source, retire, epoch + 1)
            deployed.install(record)
            changed.update(deployed.load_source(module, source))
            changed.update(retire)
        self.waiting = [w for w in self.waiting if id(w[0]) not in logged]
        if changed:
            self._recheck(changed)

    def drop(self) -> None:
        """Stepped down or failed: the queued calls were answered with everything else."""
        self.waiting.clear()

    def _recheck(self, changed: set[str]) -> None:
        pending = self._pending
        for key, call, size in pending.drain_sized():
            if call.proc.name not in changed:
                pending.push(key, call, size)
                continue
            try:
                proc = lookup(call.proc.name)  # BadRequest: retired
                if proc.dependent != call.proc.dependent:
                    raise BadRequest(
                        "bad_arguments",
                        f"{proc.name} was deployed as a {'' if proc.dependent else 'non-'}"
                        "dependent procedure while this call waited; send it again",
                    )
                proc.validate(call.args[:-1] if proc.dependent else call.args)
                call.proc = proc
                call.participants = participants(proc, call.args, self.partitions)
                self._enqueue(call, None)
            except BadRequest as e:
                why = f"{call.proc.name} was redeployed before this call ran: {e.message}"
                self._refuse(call, e.code, why)
        invariant(len(pending) >= 0, "pending calls after a deploy's recheck")

    def _refuse(self, call: PendingCall, code: str, message: str) -> None:
        value = (code, message)
        self._reply(call.identity, call.req_id, ERROR, value)
        if call.client_id:
            self.retries.finish((call.client_id, call.req_id), ERROR, value, call.digest, 0)
