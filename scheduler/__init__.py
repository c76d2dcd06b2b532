"""Scheduler role: the per-partition ordered lock manager (Calvin's scheduler)."""

from txn_library import native

native.install()  # before any compiled module is imported (txn_library.native)
