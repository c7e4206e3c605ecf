"""Moved (issue 29): each input of a run is now made where it is made and read from the run
directory: the world and tasks by the compose stage (mem1_core.data.run_tasks), the index by
the index stage (mem1_core.retrieval.run_index), the tokenizer and the starting policy by
the stage that needs them (mem1_core.models.policy), the environment (mem1_core.rollout.env)
and the checked task files and `prepare` (mem1_core.rollout.inputs). The old names import
from here, with a DeprecationWarning, until mem1_core.deprecated.REMOVED_IN."""

from mem1_core.deprecated import moved_names

__getattr__ = moved_names(__name__)  # old names (mem1_core.deprecated.MOVED)
