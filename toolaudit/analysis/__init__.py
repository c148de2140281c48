"""Figures over stored runs: rates with Wilson intervals, compounded session drift, the CI gate's
budgets and the remedy frontier.

This package imports nothing on import: its modules are imported by name."""
