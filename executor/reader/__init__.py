"""Readers: every partition of a replica in one process, following the command log epoch
by epoch by re-executing its batches, answering queries (docs/QUERIES.md, "Readers").

  follower  the role: ordered delivery of batches, applying them serially (each
            write at its key's partition), state hashes per epoch, retention of row
            versions, the comparison with the replicas' hashes
  queries   snapshot and read-committed queries answered from the follower's state
  sim_reader  a reader in the seeded simulator (handed to it: the simulator sits below)
"""
