"""Running tasks: the environment, memory policies, the scripted teacher, generation backends and the rollout loop."""
