"""TPC-C on Ordo: schema, loader, procedures, driver, consistency checks, CLI."""

from txn_library import native

native.install()  # before any compiled module is imported (txn_library.native)
