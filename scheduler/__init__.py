"""Scheduler role: the per-partition ordered lock manager (Calvin's scheduler)."""
