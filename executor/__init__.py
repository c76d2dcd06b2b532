"""Executor role: storage, transaction execution, read exchange, checkpoints, replay."""
