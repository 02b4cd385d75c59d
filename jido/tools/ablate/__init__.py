"""`jido ablate`: which serving techniques pay on a workload, each measured against the engine as users get it."""
