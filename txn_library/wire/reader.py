"""Wire contract of a reader (executor/reader/): what its one socket takes and answers.

A reader binds one ROUTER (``ClusterConfig.reader_addr``). Clients send it the very
frames a partition's query socket takes (``wire.QueryRequest``: [REQ_QUERY, client_id,
queries] -> [REP_QUERY, [[query_id, status, value, epoch], ...]]), so the client's
query channel spreads snapshot and read-committed queries over readers unchanged.
``ordo status`` (and tests) ask it how far it is:

  [REQ_READER_STATUS, [epoch, ...]]  -> [REP_READER_STATUS, {...}]
      the map: reader, pid, applied_epoch, known_last_epoch, lag_epochs, live,
      txns_applied, state_hashes (per partition at applied_epoch, 16 hex digits),
      versions_oldest, hashes_checked, determinism_violations, queries_served,
      queries_refused, and ``hashes``: the per-partition hashes of each epoch
      asked that the reader still keeps, as [[epoch, [hash, ...]], ...] (at most
      ``STATUS_EPOCHS_MAX`` asked).

A reader takes its batches as a partition does (the sequencer's publication and log
service: txn_library.wire.sequencer) and asks the leading sequencer's client socket for its
status ([REQ_STATUS]) to compare the replicas' state hashes with its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from txn_library.wire.messages import Family

REQ_READER_STATUS = 31
REP_READER_STATUS = 32
STATUS_EPOCHS_MAX = 64  # epochs one status request may ask the hashes of


class ReaderStatusRequest(NamedTuple):
    """[REQ_READER_STATUS, [epoch, ...]]"""

    epochs: tuple = ()


class ReaderStatusReply(NamedTuple):
    """[REP_READER_STATUS, {...}]"""

    report: dict


MESSAGES = Family({ReaderStatusRequest: REQ_READER_STATUS, ReaderStatusReply: REP_READER_STATUS})
encode = MESSAGES.encode
named = MESSAGES.named


def status_request_problem(msg: Any) -> str | None:
    """Why a decoded frame is not a ReaderStatusRequest, or None."""
    if not (isinstance(msg, tuple) and len(msg) in (1, 2) and msg[0] == REQ_READER_STATUS):
        return "not [REQ_READER_STATUS, epochs]"
    if len(msg) == 2:
        epochs = msg[1]
        if not (
            isinstance(epochs, tuple)
            and len(epochs) <= STATUS_EPOCHS_MAX
            and all(type(e) is int for e in epochs)
        ):
            return f"epochs: at most {STATUS_EPOCHS_MAX} ints"
    return None
