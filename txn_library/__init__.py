"""The contract every layer agrees on, in rooms.

At the top, the procedure contract: the procedure API and catalog, placement (the one
rule for where a key lives), limits (every bound), errors, and native (whether the hot
modules run compiled). Then wire/ (every message format), client/ (what programs
import: ``from txn_library.client import Client``), streams/ (streams, windows,
dataflows) and workloads/ (what ships to run). Imports go down that list only
(lint-imports), and nothing here imports the layers above txn_library."""

from txn_library import native

native.install()  # before any compiled module is imported (txn_library.native)
