"""A procedure module for tests/cluster/test_streams_cluster.py (loaded by every process
of the cluster with ``procedure_modules``): a one-step dataflow whose sink keeps few
batches, so that a subscriber falls behind its retention within a short test.

    sink_in --sink.copy--> sink_out (keeps SINK_RETAIN batches)

Batch b of ``sink_out`` holds the tuples of batch b of ``sink_in``."""

from __future__ import annotations

from txn_library.streams import Dataflow, StreamContext, stream, stream_procedure

SINK_IN = "sink_in"
SINK_OUT = "sink_out"
SINK_RETAIN = 20

stream(SINK_IN, [("x", "int")], home=1)
stream(SINK_OUT, [("x", "int")], home=1, retain_batches=SINK_RETAIN)


@stream_procedure("sink.copy", input=SINK_IN, output=SINK_OUT)
def copy(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
    return list(tuples)


Dataflow("sink", [copy])
