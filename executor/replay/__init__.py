"""Deterministic replay of one replica's history, and the Spark jobs that parallelize it.

A replica's history is complete without the replica: the command log (epochs 1..N,
sequencer.log), the replica's checkpoints (executor.core.checkpoint: every partition
snapshots at the same checkpoint-flagged epochs) and the genesis state (epoch 0). The
state at the end of any epoch E is rebuilt by loading the nearest known state at or
before E and replaying the logged batches through ``LocalReplica``: the very Partition
code (locks, read exchange, execution) that runs live, with peer messages moved in
memory. Only spark_jobs has Spark in it; Spark only decides where each piece runs.

Modules, lowest first (each imports only those above it):

- spec: ReplaySpec (where the history lives, as plain values) and the log's extent.
- boundaries: genesis and checkpoints, the states known without replay; loading them.
- verdicts: the verify table's verdicts and how a bad epoch was located.
- batches: reading the log's batches, checking them, applying them (Replayer); the
  ReplayFailure family.
- intervals: one interval's task and result row (the verify table's schema).
- diagnosis: locating a divergence (row diff, serial oracle, dependency suspects).
- verify: verifying one interval; planning and annotating a whole-history verify.
- reconstruct: the database at the end of any epoch.
- tables: the log as rows of transactions; a rebuilt table as columns.
- export: tables written to CSV or Parquet files (``ordo dump``).
- spark_session: the Spark session (one configuration for every job) and the driver
  JVM's class-data archive that set-up builds.
- spark_jobs: the verify, state and history jobs.
- spark_daemon: the Python daemon Spark starts on a local master (PySpark's own,
  importing the installed PySpark rather than Spark's source zips); imports nothing
  of Ordo's.

Invariant: nothing in this package writes to the log or checkpoint directories, and
nothing in it reads the cluster's configuration (``cluster.replay_cli`` builds the
ReplaySpec from ``cluster.json``).
"""
