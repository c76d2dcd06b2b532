"""Deterministic (Calvin-style) execution: the partition role and its ordered delivery
(partition, delivery), a whole replica in one process (replica), the serial oracle
(oracle), and the seeded whole-cluster simulator (simulator and sim_*, with its
workloads and checks): ``run_seed(seed, workload)`` runs the real sequencer and
partition roles under one seed, with crashes, lost messages and torn logs, and checks
the outcome against the serial oracle (scripts/simulate.py runs many seeds).
"""
