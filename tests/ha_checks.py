"""Checks shared by the high-availability tests (loopback and network-namespace hosts).

``check_outcome``: every call the client ledger saw answered is in the committed log
exactly once, no (client, request) is in the log twice, terms never decrease along the
log, every sequencer's local log agrees with the leader's, replicas' hashes agree per
partition and equal a serial replay of the log, every answer the ledger holds is the
serial replay's, and no determinism violation was seen: the nemesis's checks
(cluster.history_checks), each asserted.
"""

from __future__ import annotations

from cluster.config import ClusterConfig
from cluster.history_checks import check_history
from cluster.ledger import Ledger


def check_outcome(cfg: ClusterConfig, ledger: Ledger, st: dict, transfers: int) -> None:
    """The ledger against the committed log and the replicas (see module docstring)."""
    assert not ledger.failed, ledger.failed[:5]
    assert len(ledger.acked) == transfers
    checks, _serial = check_history(cfg, ledger, st)
    failed = {name: c for name, c in checks.items() if not c["ok"]}
    assert not failed, failed
