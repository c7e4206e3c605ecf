"""Subcommands of the `mem1` CLI, one module per stage."""
