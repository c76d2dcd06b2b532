"""Transactional streaming after S-Store: streams and windows are tables, dataflows of
stored procedures run per atomic batch (PE triggers), EE triggers run inside the
inserting transaction, and sinks read each batch's output once, in order.

Design and reasons: docs/STREAMS.md. The public API:

    from txn_library.streams import (Dataflow, nested, on_insert, on_slide, stream,
                                     stream_procedure, window)

``spec`` declares streams and windows (tables), ``context`` is what a step does to
them inside its transaction, ``dataflow`` binds steps into dataflows and derives their
transactions from the logged batch (``batch_txns``, ``derived_txns``).
"""

from txn_library.streams.context import (
    StreamContext,
    WindowNotOwned,
    WindowView,
    on_insert,
    on_slide,
)
from txn_library.streams.dataflow import (
    DERIVED_CLIENT,
    PUSH,
    Dataflow,
    Step,
    batch_txns,
    dataflow_named,
    dataflows,
    derived_txns,
    nested,
    stream_procedure,
)
from txn_library.streams.spec import Stream, Window, stream, stream_named, streams, window

__all__ = [
    "DERIVED_CLIENT",
    "PUSH",
    "Dataflow",
    "Step",
    "Stream",
    "StreamContext",
    "Window",
    "WindowNotOwned",
    "WindowView",
    "batch_txns",
    "dataflow_named",
    "dataflows",
    "derived_txns",
    "nested",
    "on_insert",
    "on_slide",
    "stream",
    "stream_named",
    "stream_procedure",
    "streams",
    "window",
]
