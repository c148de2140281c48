"""Reading recorded traffic: trace files in every format into `TraceCall`s and error rows, sharding.

This package imports nothing on import: its modules are imported by name."""
