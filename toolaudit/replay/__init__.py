"""Replaying recorded calls through live decode paths: inputs, the chunked resumable replayer, token
evidence, and the OpenAI Batch route.

This package imports nothing on import: its modules are imported by name."""

from toolaudit import callable_package  # `toolaudit.replay(...)` is the Python API's verb

callable_package(__name__, "replay")
