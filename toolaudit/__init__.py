"""toolaudit: measure how often two decode paths produce different tool calls for the same request."""

__version__ = "0.1.0"
