"""Prefect flows: thin wiring of mem1_core stages (unpack parameters, call, persist)."""
