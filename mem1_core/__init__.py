"""mem1_core: the MEM1 library (data, retrieval, rollout, masked trajectories, training,
evaluation). Pure Python + torch; never imports Prefect (flows live in `flows/`)."""

__version__ = "0.1.0"
