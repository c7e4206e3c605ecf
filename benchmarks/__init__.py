"""Measurement scripts: each runs as `python -m benchmarks.<name>` or `python benchmarks/<name>.py`
from the checkout and prints what it measured; `common` holds what they share."""
