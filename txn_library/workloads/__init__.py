"""Workloads that ship with Ordo: procedures, tables, dataflows and the inputs that drive
them, for the tests, the demo, the simulator and the benchmarks.

builtin.py (kv and the bank: the model for a procedure module), bank.py (transfer
inputs), contract.py (what a workload gives the simulator), stream_sim.py (a dataflow
as a simulator workload), leaderboard.py (S-Store's benchmark), chains.py,
bench_procedures.py, query_bench.py and retention_bench.py (benchmark-only).
TPC-C is a package of its own (tpcc/).

Invariant: nothing below txn_library.workloads imports it; the engine runs any workload
through the procedure contract alone. Old module names (``txn_library.builtin``, ...)
in a cluster.json or ``--module`` still load (txn_library.procedure.MODULE_ALIASES).
"""
