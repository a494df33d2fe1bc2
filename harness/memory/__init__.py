"""Memory and time inside a process: the process-tree reader, the memory ledger, the decode-step profile."""
