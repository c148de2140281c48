"""docs/cli.md, the command-line reference, generated from the click commands themselves: every command and
subcommand's `--help` (usage, help text, options with their help, examples) as click prints it, at a fixed width
so the text never depends on the terminal that generated it, in the order `toolaudit --help` lists them.

`make cli-docs` (`python -m toolaudit.cli.reference`) writes it; `--check` says which commands are stale or
undocumented and exits 1 (tests/cli/test_cli_docs.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import click

WIDTH = 100  # columns of every help text in the reference, whatever the terminal
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
FIX = "make cli-docs"
_HEADER = """# Command-line reference

<!-- Generated from the click commands by `make cli-docs` (toolaudit/cli/reference.py); do not edit by hand:
tests/cli/test_cli_docs.py fails when this file is out of date. -->

Every command's `--help`, as `toolaudit COMMAND --help` prints it. docs/guide.md shows the commands at work;
[architecture.md](architecture.md) says which module implements each (`toolaudit/cli/`).
"""


def commands(root: click.Command, name: str = "toolaudit") -> Iterator[tuple[str, click.Context]]:
    """(full command name, its context) for `root` and every command under it, depth first, as listed."""

    def walk(command: click.Command, full: str, parent: click.Context | None) -> Iterator[tuple[str, click.Context]]:
        ctx = click.Context(command, info_name=full.rsplit(" ", 1)[-1], parent=parent,
                            **{**command.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH})
        yield full, ctx
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                child = command.get_command(ctx, sub)
                if child is not None and not child.hidden:
                    yield from walk(child, f"{full} {sub}", ctx)

    yield from walk(root, name, None)


def section(name: str, ctx: click.Context) -> str:
    """One command's section: a heading naming it and its help text."""
    return f"## `{name}`\n\n```text\n{ctx.command.get_help(ctx).rstrip()}\n```\n"


def markdown(root: click.Command | None = None) -> str:
    """The whole reference: the header, a list of the commands with their one-line help, a section each."""
    if root is None:
        from toolaudit.cli import cli as root
    found = list(commands(root))
    index = "\n".join(f"- [`{name}`](#{_anchor(name)}): {ctx.command.get_short_help_str(WIDTH)}"
                      for name, ctx in found[1:])
    return "\n".join([_HEADER, index + "\n", *(section(name, ctx) for name, ctx in found)])


def sections(text: str) -> dict[str, str]:
    """A reference's sections by command name (what `section` wrote for each)."""
    out: dict[str, str] = {}
    for chunk in text.split("\n## `")[1:]:
        name = chunk.split("`", 1)[0]
        out[name] = "## `" + chunk.rstrip("\n") + "\n"
    return out


def problems(written: str, expected: str) -> list[str]:
    """What differs between the reference as written and as the commands generate it, command by command, each
    with the fix; empty when they are equal."""
    have, want = sections(written), sections(expected)
    found = [f"{name}: not documented in docs/cli.md" for name in want if name not in have]
    found += [f"{name}: its section in docs/cli.md is out of date" for name in want
              if name in have and have[name] != want[name]]
    found += [f"{name}: documented in docs/cli.md, but there is no such command" for name in have if name not in want]
    if not found and written != expected:
        found.append("docs/cli.md: the header or the list of commands is out of date")
    return [f"{line} (run `{FIX}`)" for line in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolaudit.cli.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when it differs")
    parser.add_argument("--output", type=Path, default=DOC, help=f"the reference file (default: {DOC})")
    args = parser.parse_args(argv)
    expected = markdown()
    if args.check:
        written = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        found = problems(written, expected)
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    args.output.write_text(expected, encoding="utf-8")
    print(f"wrote {args.output} ({len(sections(expected))} commands)")
    return 0


def _anchor(name: str) -> str:
    """GitHub's anchor of a `## \\`NAME\\`` heading: lowercase, spaces to hyphens, backquotes dropped."""
    return name.lower().replace(" ", "-")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
