"""What every command shares: the --db option, --run ID|NAME, output options (--as table|json|csv, --json,
--csv), library errors as one-line messages (and their exit codes), help examples, proportion parameters, and a
progress bar on terminals (a line per step when piped)."""

from __future__ import annotations

import csv
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from toolaudit import OptionError, RunNotFound, ToolauditError, UsageError
from toolaudit.report.output import csv_cell, format_table, plain, to_json

if TYPE_CHECKING:
    from toolaudit.store import Store

CONTEXT = {"help_option_names": ["-h", "--help"]}


@contextmanager
def reading(db: str) -> Iterator["Store"]:
    """The database read-only; while a replay or compare writes it, that writer's snapshot, said on stderr. A run
    asked for that the snapshot does not hold yet is said to be the one being written, not missing."""
    from toolaudit.store import Store

    with Store(db, read_only=True) as store:
        if store.snapshot is not None:
            click.echo(store.snapshot.line(db), err=True)
        try:
            yield store
        except RunNotFound as exc:
            if store.snapshot is None:
                raise
            raise RunNotFound(_not_in_snapshot(store, db, exc)) from None


def _not_in_snapshot(store: "Store", db: str, exc: RunNotFound) -> str:
    """What a reader is told when the writer's snapshot lacks the run: taken before the writer's run row (or
    its first chunk), it is no evidence that there is no such run."""
    note = store.snapshot
    run = f"{note.command} run {note.run_id}" if note.run_id is not None else f"a {note.command} run"
    writing = (f"process {note.pid} is writing {run}: it shows here once the readers' snapshot holds it, its "
               "first figures once its first chunk is stored; try again shortly")
    from toolaudit.store.queries import run_count

    if run_count(store) == 0:
        return f"{db}: no run stored yet; {writing}"
    return f"{exc}; {writing}"


def first_chunk_note(store: "Store", run_id: int | None, db: str) -> None:
    """For a run that is being written and holds no calls yet, say so on stderr (which run, by which process):
    its figures, 0 of 0 calls, are not a result. `summary` calls it before showing a run; so may any command
    that shows a run's figures."""
    from toolaudit.store.queries import held_calls

    run = store.run_row(run_id)
    if run["status"] != "running" or run["kind"] == "batch":  # a batch run waits for its other side: no writer
        return
    if held_calls(store, run["run_id"]):
        return
    note = store.snapshot
    by = f" by process {note.pid}" if note is not None else ""
    click.echo(f"note: {db}: {run['kind']} run {run['run_id']} ({run['name']}) is being written{by} and holds no "
               "calls yet: its first figures show once its first chunk is stored", err=True)


def option_group(*decorators: Callable) -> Callable[[Callable], Callable]:
    """Several click options (and arguments) as one decorator, in the order given: a command's options declared
    once beside it, so that the command function holds only what it does."""
    def apply(func: Callable) -> Callable:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def db_option(func: Callable) -> Callable:
    return click.option("--db", "db", envvar="TOOLAUDIT_DB", default="toolaudit.duckdb", show_default=True,
                        type=click.Path(dir_okay=False),
                        help="DuckDB file (or set TOOLAUDIT_DB).")(func)


class NotFoundError(click.ClickException):
    """No such run (by id or name), no runs, no database to read, or a trace file or --db folder that is not
    there: exit 2, as a usage error (click's), said without the usage line (it would not help)."""

    exit_code = 2


def friendly_errors(func: Callable) -> Callable:
    """Library errors become one-line messages, never tracebacks: exit 1 for a failure while running; 2 for what
    the command line asked wrongly: an option that cannot be used (`OptionError`, with click's usage line) or a
    run, database, trace file or folder that is not there (`RunNotFound`, `UsageError`), so that scripts tell the
    two apart (the exit codes: docs/reliability.md#exit-codes)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OptionError as exc:
            raise click.UsageError(str(exc), ctx=click.get_current_context(silent=True)) from None
        except (RunNotFound, UsageError) as exc:
            raise NotFoundError(str(exc)) from None
        except ToolauditError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def example(*lines: str) -> str:
    """A command's epilog: realistic command lines, shown as written at the end of its --help."""
    head = "Examples:" if len(lines) > 1 else "Example:"
    return "\b\n" + head + "\n" + "\n".join(f"  {line}" for line in lines)


def run_option(default: str = "the latest run", name: str = "--run", dest: str = "run_ref",
               what: str = "Run") -> Callable[[Callable], Callable]:
    """--run ID|NAME (the command receives the text; `resolve_run` turns it into a run id once the store is open)."""
    return click.option(name, dest, metavar="ID|NAME", help=f"{what} id or name (a name several runs share: the "
                        f"newest of them); default: {default}.")


def resolve_run(store: "Store", ref: str | None, option: str = "--run", before: int | None = None) -> int | None:
    """The run id that `--run ID|NAME` names (None stays None: the command's default). A name several runs share
    names the newest (with `before`: the newest older than that run), said on stderr. Raises RunNotFound."""
    if ref is None:
        return None
    from toolaudit.store.queries import find_run

    found = find_run(store, ref, before)
    run_id = found.run["run_id"]
    if found.others:
        where = f" before run {before}" if before is not None else ""
        click.echo(f"note: {option} {ref}: {len(found.others) + 1} runs{where} are named {found.run['name']!r} (runs "
                   f"{', '.join(map(str, sorted([run_id, *found.others])))}); using the newest, run {run_id}", err=True)
    return run_id


OUTPUTS = ("table", "json", "csv")


def output_options(func: Callable) -> Callable:
    """Adds --as table|json|csv and its shortcuts --json and --csv; the command receives `fmt`."""

    @click.option("--as", "as_", type=click.Choice(OUTPUTS), help="What to print: a table (default), JSON or CSV.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (--as json).")
    @click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table (--as csv).")
    @functools.wraps(func)
    def wrapper(*args: Any, as_: str | None, as_json: bool, as_csv: bool, **kwargs: Any) -> None:
        asked = {f for f, given in (("json", as_json), ("csv", as_csv), (as_, as_ is not None)) if given}
        if len(asked) > 1:
            raise click.UsageError(f"{' and '.join(sorted('--as ' + a for a in asked))} cannot be used together "
                                   "(--json is --as json, --csv is --as csv)")
        kwargs["fmt"] = asked.pop() if asked else "table"
        func(*args, **kwargs)

    return wrapper


def deprecated_format_option(func: Callable) -> Callable:
    """The older spelling of --as on `report` and `export`, hidden: --format names the trace format everywhere
    else. The command receives `old_format` and passes it to `deprecated_format`."""
    return click.option("--format", "old_format", multiple=True, hidden=True)(func)


def deprecated_format(command: str, old: tuple[str, ...], instead: str) -> tuple[str, ...]:
    """`--format X` given to `command`: said to be deprecated on stderr, and its values returned. `instead`: the
    spelling to use (`--write html|md|json`)."""
    if old:
        click.echo(f"warning: `{command} --format` is deprecated (--format names a trace format in every other "
                   f"command); use {instead}", err=True)
    return old


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> None:
    """Print query-shaped results; `[]` for JSON when there are none."""
    if fmt == "json":
        click.echo(to_json([dict(zip(columns, map(plain, row))) for row in rows]))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[csv_cell(v) for v in row] for row in rows])
    else:
        click.echo(format_table(columns, rows))


class TraceFormatName(click.ParamType):
    """`auto` or a registered trace format (toolaudit.ingest.registry: built-in formats and plug-ins), checked
    when the command runs: plug-ins load then, not when the CLI is imported."""

    name = "format"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from toolaudit.ingest import registry

        if value == "auto":
            return value
        try:
            known = registry.names()
        except ToolauditError as exc:
            self.fail(str(exc), param, ctx)
        if value not in known:
            self.fail(f"{value!r} is not a trace format (known: auto, {', '.join(known)})", param, ctx)
        return value

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(["auto", *_formats(lambda fmt: fmt.name)]) + "]"

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
        from click.shell_completion import CompletionItem

        return [CompletionItem(name, help=help) for name, help in (("auto", "detected"), *_formats(
            lambda fmt: (fmt.name, fmt.description))) if name.startswith(incomplete)]


def _formats(what: Callable) -> list:
    """`what(format)` for every registered format; none when a plug-in cannot be loaded (help still shows, and
    the command that reads traces says what is wrong)."""
    from toolaudit.ingest import registry

    try:
        return [what(reg.format) for reg in registry.registered().values()]
    except ToolauditError:
        return []


class TraceFormatOption(click.Option):
    """--format's help lists every registered format with its one-line description."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        written = self.help
        listed = _formats(lambda fmt: f"{fmt.name}: {fmt.description}")
        if listed:
            self.help = f"{written} Formats: " + "; ".join(listed) + "."
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = written


def format_option(func: Callable) -> Callable:
    """--format: how trace files are read (auto: detected from each file's first record)."""
    return click.option("--format", "trace_format", cls=TraceFormatOption, type=TraceFormatName(), default="auto",
                        show_default=True, help="Trace file format (see docs/formats.md); auto detects each "
                        "file's from its first records.")(func)


def key_options(func: Callable) -> Callable:
    """--session-key / --customer-key, which mean a dotted path in line formats and an attribute in spans."""
    func = click.option("--customer-key", default="request.metadata.customer", show_default=True,
                        help="Dotted path of the customer in each line (OpenAI, Responses logs); for spans the "
                        "attribute (span, then resource, then parent spans, then the trace; default user.id / "
                        "enduser.id, see docs/formats.md), for Langfuse the observation/trace field (default the "
                        "trace's userId).")(func)
    return click.option("--session-key", default="request.metadata.session_id", show_default=True,
                        help="Dotted path of the session id in each line (OpenAI, Responses logs); for spans the "
                        "attribute (span, then resource, then parent spans, then the trace; default "
                        "gen_ai.conversation.id / session.id, else the trace id, see docs/formats.md), for "
                        "Langfuse the observation/trace field (default sessionId).")(func)


class ShardParam(click.ParamType):
    """`K/N`: shard K (1-based) of N, by a stable hash of the session id (see toolaudit.ingest.shards)."""

    name = "K/N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from toolaudit import ConfigError
        from toolaudit.ingest.shards import Shard, parse_shard

        if isinstance(value, Shard):
            return value
        try:
            return parse_shard(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


def shard_option(func: Callable) -> Callable:
    return click.option("--shard", type=ShardParam(), help="Only the sessions of shard K of N (1-based, by a "
                        "stable hash of the session id); each shard writes its own --db, `toolaudit merge` "
                        "combines them exactly.")(func)


RAY_LOCAL = "local"  # `--ray` with no address: a local Ray


def ray_options(what: str, workers: str) -> Callable[[Callable], Callable]:
    """--ray [ADDRESS] and --ray-workers N; the command receives `ray_address` and `ray_workers` (see
    `ray_settings`). `what`: what goes to the cluster; `workers`: what one worker is."""
    def decorate(func: Callable) -> Callable:
        func = click.option("--ray-workers", type=click.IntRange(1), metavar="N",
                            help=f"With --ray: {workers} (default: as many as the cluster holds).")(func)
        return click.option("--ray", "ray_address", is_flag=False, flag_value=RAY_LOCAL, metavar="[ADDRESS]",
                            help=f"{what} on a Ray cluster (Ray Data); the rows are written here. ADDRESS: auto, "
                                 "ray://HOST:10001 or HOST:6379; alone: a local Ray. Needs pip install "
                                 "'toolaudit[ray]'. See docs/scaling.md.")(func)
    return decorate


def ray_settings(address: str | None, workers: int | None) -> Any:
    """`--ray [ADDRESS]` as `ray_cluster.RayOptions` (None without --ray). A trace file right after a bare `--ray`
    would be taken for its address: refuse that rather than try to connect to a file name."""
    if address is None:
        if workers is not None:
            raise click.UsageError("--ray-workers needs --ray")
        return None
    if os.path.isfile(address):
        raise click.UsageError(f"--ray took {address!r} as its cluster address; put --ray after the trace files, "
                               f"or write --ray {RAY_LOCAL}")
    from toolaudit.compare.ray_cluster import RayOptions, import_ray

    import_ray()  # before any store opens: without Ray, say which extra to install
    return RayOptions(None if address == RAY_LOCAL else address, workers)


def verbose_option(func: Callable) -> Callable:
    """--verbose: engines' own output (vLLM, transformers, warnings) on the terminal instead of a log file."""
    return click.option("--verbose", "-v", is_flag=True, help="Show engines' own logs and warnings on the "
                        "terminal (default: written to DB.engines.log beside --db, named at the end).")(func)


def schema_dir_or_none(schema_dir: str) -> str | None:
    return schema_dir if os.path.isdir(schema_dir) else None


class Proportion(click.ParamType):
    """`0.015` or `1.5%` (with points=True also `0.5pp`), as a fraction."""

    name = "P"

    def __init__(self, points: bool = False):
        self.points = points
        self.name = "PP" if points else "P"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from toolaudit.analysis.budgets import parse_proportion

        if isinstance(value, float):
            return value
        try:
            return parse_proportion(value, points=self.points)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def budget_options(command: str) -> Callable[[Callable], Callable]:
    """The budget options `analysis/budgets.py` declares for `command` (`BUDGET_OPTIONS`), as click options; their
    values reach the command as keyword arguments named as `Budget`'s fields (`**budgets`)."""
    from toolaudit.analysis.budgets import BUDGET_OPTIONS

    return option_group(*(click.option(o.flag, o.field, type=Proportion(points=o.points), help=o.help[command])
                          for o in BUDGET_OPTIONS if command in o.help))


RULES = ("upper", "point", "lower")  # toolaudit.analysis.rules.Rule, named here so --help imports no analysis


def rule_option(func: Callable) -> Callable:
    """Adds --rule (upper|point|lower), the one rule `check` and `frontier` judge drift budgets by."""
    return click.option("--rule", type=click.Choice(RULES), default=None,
                        help="What must be within budget: the 95% Wilson upper bound (default: fail unless the "
                             "data show the budget is met), the point estimate, or the lower bound (fail only when "
                             "the data show it is exceeded).")(func)


def gate_rule(rule: str | None, use_upper_bound: bool = False) -> Any:
    """The `Rule` asked for; `--use-upper-bound` is the older spelling of `--rule upper`."""
    from toolaudit.analysis.rules import DEFAULT_RULE, Rule

    if use_upper_bound and rule not in (None, "upper"):
        raise click.UsageError(f"--use-upper-bound means --rule upper; it cannot go with --rule {rule}")
    return Rule(rule) if rule else Rule.UPPER if use_upper_bound else DEFAULT_RULE


class Progress:
    """Progress on stderr: a click bar on a terminal; when piped, one line per `log_every` of progress (so a
    long replay in CI or under `tee` is never silent for minutes). Nothing when the total is unknown (0)."""

    def __init__(self, label: str, length: int, unit: str = "", log_every: float = 0.0):
        self.label, self.length, self.unit, self.log_every = label, length, unit, log_every
        self.bar = None
        self.done = 0
        self.started = time.monotonic()
        self._next_log = log_every
        if sys.stderr.isatty() and length > 0:
            self.bar = click.progressbar(length=length, label=label, file=sys.stderr, show_eta=True,
                                         show_pos=not unit)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.log_every and self.length and self.done >= self._next_log:
            self._next_log = self.done + self.log_every
            elapsed = time.monotonic() - self.started
            eta = elapsed / self.done * (self.length - self.done) if self.done else 0.0
            click.echo(f"{self.label}: {self.done}/{self.length}{self.unit} ({100 * self.done / self.length:.0f}%, "
                       f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s)", err=True)

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
