"""Replaying recorded calls through live decode paths: inputs, the chunked resumable replayer, token
evidence, and the OpenAI Batch route.

This package imports nothing on import: its modules are imported by name."""
