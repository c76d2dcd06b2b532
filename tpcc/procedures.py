"""Kept so that a cluster made before the TPC-C transactions moved to their own modules
(tpcc.transactions) loads: its cluster.json names this module among its procedure
modules. Importing it registers every TPC-C procedure, as tpcc.transactions does."""

import tpcc.transactions  # noqa: F401
