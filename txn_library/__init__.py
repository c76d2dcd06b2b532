"""The contract every layer agrees on: the procedure API and catalog, placement (the
one rule for where a key lives), limits (every bound), errors, the named wire messages,
the workload contract of the simulator, the client, and native (whether the hot modules
run compiled). Imports nothing of Ordo's."""

from txn_library import native

native.install()  # before any compiled module is imported (txn_library.native)
