"""The sections of benchmarks/gpu_check.py, one module each, each with `run(check)`:
exactness, train_step, ppo, text_stops, vllm_agreement, vllm_deployment (and the latter's
driver, run in the Prefect venv); `base` holds what they share."""
