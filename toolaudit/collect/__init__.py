"""`toolaudit collect`: an OTLP/HTTP receiver that keeps the model calls of production traffic as OTLP/JSON
files, and the selection that reads them back for `replay --collected` and `compare --collected`. Modules:
`receiver` (the aiohttp app and its lifecycle), `otlp_json` (protobuf and JSON bodies as OTLP/JSON, hex ids,
responses), `keep` (which spans are kept), `store` (durable hourly files), `select` (a window and a sample of
whole sessions, written as one OTLP/JSON file). opentelemetry-proto (the `collect` extra) loads on first use.
"""
