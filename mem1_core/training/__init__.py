"""Training stages (RL loop, SFT, pretraining) and their runtime: Ray workers, the learner, FSDP."""
