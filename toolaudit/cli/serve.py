"""`toolaudit serve`: an OpenAI-compatible endpoint around an in-process decode path."""

from __future__ import annotations

import click

from toolaudit.cli.common import example, friendly_errors


@click.command(epilog=example("toolaudit serve --path spec-ngram --port 8000"))
@click.option("--path", "path_name", required=True,
              help="Decode path to serve: one whose engine runs in process (torch, hf, vllm, in-process plug-ins).")
@click.option("--paths", "paths_file", type=click.Path(dir_okay=False, exists=True),
              help="paths.toml with [paths.NAME] tables (default: built-in target and spec-ngram).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind; 0 picks a free one (the address is printed on stderr).")
@click.option("--batch-wait-ms", default=5.0, show_default=True, type=click.FloatRange(0, 1000),
              help="How long a short queue waits for more requests to batch (paths with batch_size > 1).")
@friendly_errors
def serve(path_name: str, paths_file: str | None, host: str, port: int, batch_wait_ms: float) -> None:
    """Serve a decode path over an OpenAI-compatible HTTP API (chat completions, models, health, metrics)."""
    from toolaudit import OptionError
    from toolaudit.engines.paths import load_paths
    from toolaudit.serve import serve as run_server

    paths = load_paths(paths_file)
    if path_name not in paths:
        raise OptionError(f"unknown decode path {path_name!r} (known: {', '.join(sorted(paths))})")
    run_server(paths[path_name], host=host, port=port, batch_wait_s=batch_wait_ms / 1000)
