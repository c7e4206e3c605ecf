"""Moved (issue 29): a pipeline run's summary is rendered by mem1_core.evaluation.run_summary,
beside the headline it renders; runs/ keeps the run directory's layout, checkpoints, atomic
writes and progress. The old names import from here, with a DeprecationWarning, until
mem1_core.deprecated.REMOVED_IN."""

from mem1_core.deprecated import moved_names

__getattr__ = moved_names(__name__)  # old names (mem1_core.deprecated.MOVED)
