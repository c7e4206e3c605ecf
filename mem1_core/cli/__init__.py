"""The `mem1` command line: `main` dispatches to one module per stage in `commands/`."""
