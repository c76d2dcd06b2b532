"""Rewrite the metric table of docs/OPERATIONS.md from cluster/metrics/catalog.py.

    .venv/bin/python scripts/gen_metrics_doc.py

The table sits between the page's ``<!-- metrics table: begin/end -->`` markers;
tests/unit/test_metrics.py fails while the page and the catalog differ.
"""

from __future__ import annotations

from cluster.metrics.catalog import DOC, rewrite_doc

if __name__ == "__main__":
    print(f"{DOC}: {'rewritten' if rewrite_doc() else 'up to date'}")
