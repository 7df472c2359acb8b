"""AWS ParallelCluster configuration (pure function) and its offline schema validator."""
