"""The RL math: advantage estimators, losses, the critic and the PPO update."""
