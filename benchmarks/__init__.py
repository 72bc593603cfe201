"""normserve's benchmark suite: in-process floors, codec costs, HTTP load against peers, batching, memory."""
