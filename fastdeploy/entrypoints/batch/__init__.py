"""Offline batch inference over OpenAI batch files (`python -m fastdeploy.entrypoints.run_batch`)."""
from fastdeploy.entrypoints.openai import constraints  # noqa: F401  the body's output keys, shared with the server
