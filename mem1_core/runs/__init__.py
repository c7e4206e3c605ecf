"""The run directory: its layout and assets, checkpoints, atomic writes."""
