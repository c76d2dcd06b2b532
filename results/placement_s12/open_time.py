"""In-process cost of one bank.open of N accounts (2 partitions, LocalReplica, no
sockets), with the tree at ROOT; prints CPU ms per call over 7 calls.

    .venv/bin/python results/placement_s12/open_time.py ROOT N

Used for open_time.txt: ROOT alternated between a worktree of 56f9e70 (before) and the
main tree at fd534c6 (after), one fresh process per line.
"""

import sys
import time

root = sys.argv[1]
sys.path.insert(0, root)

import txn_library.builtin  # noqa: E402, F401  (registers bank.*)
from executor.deterministic.replica import LocalReplica  # noqa: E402
from sequencer.calls import make_batch  # noqa: E402
from txn_library import catalog, native  # noqa: E402

assert catalog.__file__.startswith(root), catalog.__file__
n = int(sys.argv[2])
replica = LocalReplica(2)
ts = 1_700_000_000_000
batches = [make_batch(e, e * 10, ts, e, [("bank.open", (10**6 * e, n, 1))], 2) for e in range(1, 9)]
replica.apply(batches[0])
t0 = time.process_time()
for b in batches[1:]:
    replica.apply(b)
ms = (time.process_time() - t0) / 7 * 1000
which = "before" if "exp" in root else "after"
print(f"{which} {native.describe()[:8]} bank.open({n}) {ms:.1f} ms")
