"""The contract every layer agrees on: the procedure API and catalog, placement (the
one rule for where a key lives), limits (every bound), errors, the named wire messages,
the workload contract of the simulator, and the client. Imports nothing of Ordo's."""
