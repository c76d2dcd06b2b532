"""A stand-in role for tests of cluster.ownership's lifeline: it watches its lifeline
(as every role does at start) and then waits, as a role's loop would."""

from __future__ import annotations

import time

from cluster.ownership import watch_lifeline

if __name__ == "__main__":
    print("watching" if watch_lifeline() else "no lifeline", flush=True)
    time.sleep(600)
