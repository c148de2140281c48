"""`toolaudit serve`: an OpenAI-compatible HTTP server around an in-process decode path. Modules: `app` (routes,
batching host, process lifecycle), `api` (request parsing and response shapes), `metrics` (Prometheus)."""

from __future__ import annotations

from .app import serve

__all__ = ["serve"]
