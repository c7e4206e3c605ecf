"""The trajectory record, its prefix tree of turn contexts, the tree masks, and log-probs over it."""
