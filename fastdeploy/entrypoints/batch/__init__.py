"""Offline batch inference over OpenAI batch files (`python -m fastdeploy.entrypoints.run_batch`)."""
