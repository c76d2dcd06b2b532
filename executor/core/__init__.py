"""What every engine shares: storage with its state hash, the context a procedure body
sees, execution and write-set validation, checkpoints, and start-up from genesis."""
