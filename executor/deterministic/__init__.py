"""Deterministic execution tools; for now the seeded whole-cluster simulator.

``executor.deterministic.simulator.run_seed(seed, workload)`` runs the real sequencer
and partition roles of a whole cluster in one process under one seed, with crashes,
lost messages and torn logs, and checks the outcome against the serial oracle. See
that module's docstring, and scripts/simulate.py to run many seeds.
"""
