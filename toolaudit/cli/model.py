"""`toolaudit model ...`: the models the in-process engines run. `model draft` derives an early-exit self-draft
(the first N layers of a model, `toolaudit.engines.drafts`) for draft-model speculation."""

from __future__ import annotations

from pathlib import Path

import click

from toolaudit.cli.common import CONTEXT, example, friendly_errors, output_options, print_rows
from toolaudit.report.output import to_json


@click.group(context_settings=CONTEXT, epilog=example("toolaudit model draft --layers 8"))
def model() -> None:
    """Prepare the models that in-process engines run (drafts for speculation)."""


@model.command(epilog=example("toolaudit model draft --layers 8 --model smollm2-135m"))
@click.option("--layers", type=click.IntRange(1), required=True, help="Decoder layers the draft keeps (the first N).")
@click.option("--model", "spec", default="smollm2-135m", show_default=True,
              help="The target: built-in name, model directory or .gguf file.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Write the draft here instead of the model cache (the paths.toml snippet then names it).")
@output_options
@friendly_errors
def draft(layers: int, spec: str, out: Path | None, fmt: str) -> None:
    """Derive a draft model from a target's first N layers; print it and the paths.toml that uses it."""
    from toolaudit.engines.models import draft_model

    d = draft_model(spec, layers, out)
    # In the cache the spec form needs no path; a directory given with --out is named by its path.
    name = str(d.directory) if out is not None else f"{spec}:first{layers}"
    snippet = (f'[paths.spec-draft]\nmodel = "{spec}"\n'
               f'speculative = {{ method = "draft_model", model = "{name}", num_speculative_tokens = 3 }}')
    data = {"directory": str(d.directory), "model": name, "layers": d.layers, "source_layers": d.source_layers,
            "parameters": d.parameters, "source": str(d.source), "paths_toml": snippet}
    if fmt == "json":
        click.echo(to_json(data))
        return
    if fmt == "csv":
        print_rows(list(data), [list(data.values())], "csv")
        return
    click.echo(f"draft: {d.directory}\n"
               f"layers: {d.layers} of {d.source_layers} (with the embedding, final norm and LM head of {spec})\n"
               f"parameters: {d.parameters:,}\n\n"
               f"paths.toml:\n{snippet}")
