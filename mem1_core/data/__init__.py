"""The embedded default's world, the QA sources, task composition and the task prompt."""
