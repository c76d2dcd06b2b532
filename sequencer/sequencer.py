"""The sequencer role: validate calls, fix their order in epochs, log, hand out batches.

No sockets, clock or entropy of its own: ``on_frame`` takes one raw client frame,
``run_intake`` validates queued calls, ``on_results_message`` takes a partition's
report, ``tick`` cuts a batch; replies and queries accumulate in outboxes that the
process loop sends. The clock and the seed source are parameters.

``Sequencer`` is the role the servers and the simulator drive: a thin facade over the
parts that do the work, each an object of its own module with its invariants:

  intake.py    validate calls and admit them into per-connection pending queues
  queries.py   queries to partitions (reconnaissance, read-only calls, result lookups)
  epochs.py    cut, stamp, log and hand out batches; flow control; checkpoint flags;
               the log service; fail-stop and step-down
  results.py   partitions' results: first replica answers, later ones compared;
               restarts of dependent calls; query answers
  deploys.py   deploy calls: the module checked first, installed once logged
  outbox.py    what the process loop sends
  here         the wiring, control requests (status, checkpoint, log pruning)

Who owns the state several parts use. The facade builds these containers once and
hands each part the ones it uses; the owner keeps a container's invariants, the others
use it only as said here. None is ever replaced while the role lives (the parts hold
them), except the retry cache, which ``retries`` replaces in every part that holds it.

  pending calls    intake.py admits calls; epochs.py takes each batch, and empties
                   them at fail-stop and step-down; results.py re-admits restarted
                   calls through ``Intake.enqueue``
  retry cache      intake.py decides what a retry gets and starts entries;
                   results.py finishes them with the answer, and fills it from the
                   log at start-up (``Results.remember_logged``)
  in-flight table  results.py; epochs.py adds each batch's calls and bounds the
                   backlog, fail-stop and step-down empty it; intake.py counts it
  query table      queries.py; results.py takes answers out; step-down empties it
  partitions'      results.py records them (``stats.partitions``, ``heard_at``);
  reports          epochs.py reads them for flow control, the facade for status
  stats            one SequencerStats; each part counts its own counters
  outboxes         outbox.py; every part writes through it
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sequencer.calls import InFlight, PendingCall, os_seed
from sequencer.deploys import DeployChecker, Deploys, install_logged, keep_before_prune
from sequencer.epochs import Epochs
from sequencer.fair import FairQueues
from sequencer.intake import Intake
from sequencer.log import CommandLog
from sequencer.outbox import Outbox
from sequencer.queries import Queries
from sequencer.replication import ReplicatedLog
from sequencer.results import Results
from sequencer.retry_cache import RetryCache
from sequencer.status import SequencerStats, status_report
from txn_library.errors import ERR_UNAVAILABLE, BadRequest
from txn_library.wire import sequencer as wire
from txn_library.wire.sequencer import (
    ClusterInfoReply,
    ControlReply,
    ErrorReply,
    OkReply,
    PruneRequest,
    StatusReply,
)

HEARTBEAT_MS = 100  # an idle sequencer publishes its last epoch this often

_ARCHIVE_PATH_MAX = 4096


class Sequencer:
    """The ordering role. Its entry points are bound once, in ``__init__``, to the part
    that does the work (no call added per frame or per call):

      intake   on_frame, has_intake, intake_room, run_intake, on_calls, reply, _error
      epochs   has_pending, batch_full, request_checkpoint, tick, unapplied_bytes,
               log_fetch_reply, log_reply, step_down
      results  on_results_frame, on_results_message, on_results
      outbox   take_client_out, take_client_replies, take_control_out, take_query_out
    """

    def __init__(
        self,
        command_log: CommandLog | ReplicatedLog,
        replicas: int,
        partitions: int,
        *,
        checkpoint_every_epochs: int = 0,
        checkpoint_every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        seed_source: Callable[[], int] = os_seed,
        term: int = 0,
        dataflow_recovery: str = "strong",
        deploy_checker: DeployChecker | None = None,
    ) -> None:
        self.log = command_log
        # The procedures deployed through this log, before any call is validated or
        # the exactly-once table rebuilt from it (sequencer.deploys).
        install_logged(command_log)
        self.term = term  # the leader term every batch carries (0: no replication)
        self.replicas = replicas
        self.partitions = partitions
        self.checkpoint_every_epochs = checkpoint_every_epochs
        self.checkpoint_every_s = checkpoint_every_s
        self.clock = clock
        self.seed_source = seed_source
        self.stats = SequencerStats()
        # The process adds who it is to every status report (role, member, pid, ...).
        self.status_extra: Callable[[], dict] | None = None
        # The process gives where queries go (cluster.cluster_info), for REQ_CLUSTER_INFO.
        self.cluster_info: dict | None = None

        # The shared containers (their owners: the module docstring).
        self.outbox = outbox = Outbox()
        pending: FairQueues[PendingCall] = FairQueues()
        inflight: OrderedDict[int, InFlight] = OrderedDict()
        heard_at: dict[tuple[int, int], float] = {}  # clock time of last status
        retries = RetryCache()
        # Query ids start at a random point in each incarnation (queries.py).
        self.queries = queries = Queries(replicas, outbox, seed_source() >> 2)
        self.epochs = epochs = Epochs(
            command_log,
            pending,
            inflight,
            queries,
            outbox,
            self.stats,
            heard_at,
            partitions=partitions,
            checkpoint_every_epochs=checkpoint_every_epochs,
            checkpoint_every_s=checkpoint_every_s,
            clock=clock,
            seed_source=seed_source,
            term=term,
            dataflow_recovery=dataflow_recovery,
        )
        self.intake = intake = Intake(
            command_log,
            epochs,
            pending,
            inflight,
            queries,
            retries,
            outbox,
            self.stats,
            replicas=replicas,
            partitions=partitions,
            clock=clock,
            on_control=self._on_control,
            dataflow_recovery=dataflow_recovery,
        )
        self.results = results = Results(
            intake,
            queries,
            inflight,
            retries,
            outbox,
            self.stats,
            heard_at,
            replicas=replicas,
            partitions=partitions,
            clock=clock,
        )

        self.deploys = deploys = Deploys(
            deploy_checker,
            pending,
            retries,
            outbox.reply,
            intake.enqueue,
            partitions=partitions,
        )
        intake.deploys = epochs.deploys = deploys

        # The entry points, bound once.
        self.on_frame = intake.on_frame
        self.has_intake = intake.has_intake
        self.intake_room = intake.intake_room
        self.run_intake = intake.run_intake
        self.on_calls = intake.on_calls
        self.reply = intake.reply
        self._error = intake.error  # the server answers a frame it cannot hand over
        self.has_pending = epochs.has_pending
        self.batch_full = epochs.batch_full
        self.request_checkpoint = epochs.request_checkpoint
        self.unapplied_bytes = epochs.unapplied_bytes
        self.log_fetch_reply = epochs.log_fetch_reply
        self.log_reply = epochs.log_reply
        self.step_down = epochs.step_down
        self.on_results_frame = results.on_results_frame
        self.on_results_message = results.on_results_message
        self.on_results = results.on_results
        self.take_client_out = outbox.take_client_out
        self.take_client_replies = outbox.take_client_replies
        self.take_control_out = outbox.take_control_out
        self.take_query_out = outbox.take_query_out

        results.remember_logged(command_log)

    def tick(self, now_ms: int) -> bytes | None:
        """Epochs.tick, after taking the module checker's answers (sequencer.deploys)."""
        self.deploys.poll()
        return self.epochs.tick(now_ms)

    # State kept by the parts -----------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.epochs.epoch

    @property
    def next_txn_id(self) -> int:
        return self.epochs.next_txn_id

    @property
    def failed(self) -> str | None:
        """Fail-stop: once the log cannot be written or synced, nothing is accepted."""
        return self.epochs.failed

    @property
    def deposed(self) -> str | None:
        """Stepped down: another sequencer leads (or the store is unreachable)."""
        return self.epochs.deposed

    @property
    def retries(self) -> RetryCache:
        return self.intake.retries

    @retries.setter
    def retries(self, cache: RetryCache) -> None:
        self.intake.retries = self.results.retries = self.deploys.retries = cache

    @property
    def _logged_txns(self) -> dict[int, tuple[bytes, Any]]:
        """results.py's calls logged before a restart (the simulator's planted bug
        ``no-retry-rebuild`` empties it)."""
        return self.results.logged_txns

    @property
    def client_out(self) -> dict[bytes, list]:
        return self.outbox.client_out

    @property
    def control_out(self) -> list[tuple[bytes, ControlReply]]:
        return self.outbox.control_out

    @property
    def query_out(self) -> dict[tuple[int, int], list]:
        return self.outbox.query_out

    # Control requests ------------------------------------------------------------
    def _on_control(self, identity: bytes, msg: tuple) -> None:
        """REQ_STATUS, REQ_CLUSTER_INFO, REQ_CHECKPOINT or REQ_PRUNE (intake.py checked
        the kind)."""
        kind = msg[0]
        reply: ControlReply
        if kind == wire.REQ_STATUS:
            reply = StatusReply(self.status_report())
        elif kind == wire.REQ_CLUSTER_INFO:
            if self.cluster_info is None:
                reply = ClusterInfoReply({})  # the client says it names no address
            else:
                reply = ClusterInfoReply(self.cluster_info)
        elif kind == wire.REQ_CHECKPOINT:
            reply = OkReply(self.request_checkpoint())
        else:
            reply = self._prune_request(msg)
        self.outbox.control_out.append((identity, reply))

    def _prune_request(self, msg: tuple) -> OkReply | ErrorReply:
        if len(msg) != 2:
            return ErrorReply("REQ_PRUNE is [kind, archive_dir or None]")
        archive = PruneRequest._make(msg[1:]).archive_dir  # checked below
        if archive is not None and (
            not isinstance(archive, str) or not archive or len(archive) > _ARCHIVE_PATH_MAX
        ):
            return ErrorReply("archive must be a directory path (a string) or None")
        try:
            return OkReply(self.prune_log(archive))
        except BadRequest as e:
            return ErrorReply(e.message)
        except OSError as e:
            return ErrorReply(f"pruning failed: {e.strerror or e}")

    def prune_log(self, archive_dir: str | None) -> list[str]:
        """Drop log segments older than every partition's newest checkpoint."""
        want = self.replicas * self.partitions
        parts = self.stats.partitions
        if len(parts) < want:
            raise BadRequest(ERR_UNAVAILABLE, f"only {len(parts)} of {want} partitions reported")
        bound = min(st.newest_checkpoint_epoch for st in parts.values())
        if bound <= 0:
            raise BadRequest(ERR_UNAVAILABLE, "some partition has no checkpoint yet")
        archive = Path(archive_dir) if archive_dir else None
        keep_before_prune(self.log)  # deploys outlive their segments (sequencer.deploys)
        return [str(p) for p in self.log.delete_segments_before(bound + 1, archive)]

    # Status ---------------------------------------------------------------------
    def status_report(self, now: float | None = None) -> dict:
        """Counters and every partition's last status; ``down`` if it went quiet."""
        epochs, pending = self.epochs, self.intake.pending
        report = status_report(
            self.stats,
            self.results.heard_at,
            self.clock() if now is None else now,
            epoch=epochs.epoch,
            term=self.term,
            next_txn_id=epochs.next_txn_id,
            failed=epochs.failed,
            deposed=epochs.deposed,
            log_first_epoch=self.log.first_epoch,
            intake_slices_queued=len(self.intake.slices),  # of up to intake_quantum_calls
            pending=len(pending),
            pending_bytes=pending.total_bytes,
            in_flight=len(self.results.inflight),
            retry_cache_entries=len(self.retries),
            retry_cache_bytes=self.retries.answered_bytes,
        )
        if self.status_extra is not None:
            report.update(self.status_extra())
        return report
