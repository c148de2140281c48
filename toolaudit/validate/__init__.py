"""Parsing model answers into tool calls and validating their arguments against JSON Schemas.

This package imports nothing on import: its modules are imported by name."""
