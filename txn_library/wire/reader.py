"""Wire contract of a reader (executor/reader/): what its one socket takes and answers.

A reader binds one ROUTER (``ClusterConfig.reader_addr``). Clients send it the very
frames a partition's query socket takes (``wire.QueryRequest``: [REQ_QUERY, client_id,
queries] -> [REP_QUERY, [[query_id, status, value, epoch], ...]]), so the client's
query channel spreads snapshot and read-committed queries over readers unchanged.
``ordo status`` (and tests) ask it how far it is:

  [REQ_READER_STATUS, [epoch, ...]]  -> [REP_READER_STATUS, {...}]
      the map: reader, pid, applied_epoch, known_last_epoch, lag_epochs, live,
      txns_applied, state_hashes (per partition at applied_epoch, 16 hex digits),
      versions_oldest (the oldest epoch a snapshot is served at), retention_s,
      hashes_checked, determinism_violations, queries_served,
      queries_refused, and ``hashes``: the per-partition hashes of each epoch
      asked that the reader still keeps, as [[epoch, [hash, ...]], ...] (at most
      ``STATUS_EPOCHS_MAX`` asked).

Sinks are pushed (executor/reader/sinks.py): a subscriber sends

  [REQ_SUBSCRIBE, sub_id, stream, next_batch | None]
      subscribe to ``stream`` from ``next_batch`` (None: the oldest batch the stream
      keeps), and later the same frame again, as its acknowledgement (the next batch
      id it has not taken) and its lease renewal (``limits.sink_renew_s``);
  [REQ_UNSUBSCRIBE, sub_id]

and the reader answers every subscribe, and pushes each new batch as it applies the
epoch that made it, in frames

  [REP_SINK, sub_id, epoch, page | None, error | None]
      ``page`` as ``stream.read`` returns it ({"batches": [[batch_id, tuples], ...],
      "first", "last", "dropped"}), read at the reader's applied ``epoch``; ``error``
      [code, message] (an unknown stream, overloaded, not caught up yet).

A reader takes its batches as a partition does (the sequencer's publication and log
service: txn_library.wire.sequencer) and asks the leading sequencer's client socket for its
status ([REQ_STATUS]) to compare the replicas' state hashes with its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from txn_library.wire.messages import Family

REQ_READER_STATUS = 31
REP_READER_STATUS = 32
REQ_SUBSCRIBE = 33
REQ_UNSUBSCRIBE = 34
REP_SINK = 35
STATUS_EPOCHS_MAX = 64  # epochs one status request may ask the hashes of
SUB_ID_MAX = (1 << 63) - 1
STREAM_NAME_CHARS_MAX = 256
BATCH_ID_MAX = (1 << 63) - 1


class ReaderStatusRequest(NamedTuple):
    """[REQ_READER_STATUS, [epoch, ...]]"""

    epochs: tuple = ()


class ReaderStatusReply(NamedTuple):
    """[REP_READER_STATUS, {...}]"""

    report: dict


class SubscribeRequest(NamedTuple):
    """[REQ_SUBSCRIBE, sub_id, stream, next_batch | None]"""

    sub_id: int
    stream: str
    next_batch: int | None


class UnsubscribeRequest(NamedTuple):
    """[REQ_UNSUBSCRIBE, sub_id]"""

    sub_id: int


class SinkPush(NamedTuple):
    """[REP_SINK, sub_id, epoch, page | None, error | None]"""

    sub_id: int
    epoch: int
    page: dict | None
    error: tuple | None = None


MESSAGES = Family(
    {
        ReaderStatusRequest: REQ_READER_STATUS,
        ReaderStatusReply: REP_READER_STATUS,
        SubscribeRequest: REQ_SUBSCRIBE,
        UnsubscribeRequest: REQ_UNSUBSCRIBE,
        SinkPush: REP_SINK,
    }
)
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


def subscribe_problem(msg: Any) -> str | None:
    """Why a decoded frame is not a SubscribeRequest or UnsubscribeRequest, or None."""
    if not (isinstance(msg, tuple) and msg and msg[0] in (REQ_SUBSCRIBE, REQ_UNSUBSCRIBE)):
        return "not [REQ_SUBSCRIBE, sub_id, stream, next_batch] or [REQ_UNSUBSCRIBE, sub_id]"
    if len(msg) != (4 if msg[0] == REQ_SUBSCRIBE else 2):
        return "a subscribe is [REQ_SUBSCRIBE, sub_id, stream, next_batch]" + (
            "" if msg[0] == REQ_SUBSCRIBE else "; an unsubscribe [REQ_UNSUBSCRIBE, sub_id]"
        )
    if not (type(msg[1]) is int and 0 <= msg[1] <= SUB_ID_MAX):
        return f"sub_id: an int in 0..{SUB_ID_MAX}"
    if msg[0] == REQ_UNSUBSCRIBE:
        return None
    if not (type(msg[2]) is str and 0 < len(msg[2]) <= STREAM_NAME_CHARS_MAX):
        return f"stream: a name of 1..{STREAM_NAME_CHARS_MAX} characters"
    if not (msg[3] is None or (type(msg[3]) is int and 0 <= msg[3] <= BATCH_ID_MAX)):
        return f"next_batch: None or an int in 0..{BATCH_ID_MAX}"
    return None


def sink_push_problem(msg: Any) -> str | None:
    """Why a decoded frame from a reader is not a SinkPush a subscriber can take, or None
    (the page's own shape is checked where its batches are taken)."""
    if not (isinstance(msg, tuple) and len(msg) == 5 and msg[0] == REP_SINK):
        return "not [REP_SINK, sub_id, epoch, page, error]"
    _, sub_id, epoch, page, error = msg
    if not (type(sub_id) is int and type(epoch) is int):
        return "sub_id and epoch: ints"
    if (page is None) == (error is None):
        return "one of page and error"
    if page is not None and not isinstance(page, dict):
        return "page: a map"
    if error is not None and not (
        isinstance(error, tuple) and len(error) == 2 and all(type(x) is str for x in error)
    ):
        return "error: [code, message]"
    return None
