"""A third-party engine, for real: `tests/plugins/toolaudit-echo-engine` is built and installed with pip into a
temporary --target directory, which the `toolaudit` subprocesses below find on PYTHONPATH. Nothing in toolaudit
names the echo engine: it arrives through its `toolaudit.engines` entry point.

A replay through two echo paths (one calls the first tool of each request, the other the last) must store one
row per call, drifting exactly where a request offers more than one tool; `toolaudit fingerprint` must give the
fingerprint stored with the run. The noisy path's own output (log records, warnings, prints, a worker process)
goes to the engine log, not the terminal, unless --verbose. A second distribution registering the same name,
or an entry point that fails to load, is a clear error for that name only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DEMO, REPO, openai_path_toml

from toolaudit.store import Store

PLUGIN = REPO / "tests" / "plugins" / "toolaudit-echo-engine"
LIMIT = 12


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plug-in installed by pip (built from a copy: an in-tree build would leave build/ and egg-info)."""
    tmp = tmp_path_factory.mktemp("plugin")
    source, target = tmp / "src", tmp / "site"
    shutil.copytree(PLUGIN, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(target), str(source)],
                   check=True, capture_output=True, timeout=300)
    assert (target / "toolaudit_echo_engine-0.1.0.dist-info" / "entry_points.txt").is_file()
    return target


@pytest.fixture
def paths_file(tmp_path) -> Path:
    path = tmp_path / "paths.toml"
    path.write_text('[paths.echo-first]\nengine = "echo"\nmax_tokens = 32\n\n'
                    '[paths.echo-last]\nengine = "echo"\npick = "last"\nnoisy = true\nmax_tokens = 32\n'
                    + openai_path_toml("remote", "http://127.0.0.1:9/v1", "m"))
    return path


def toolaudit(*args: str, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [*pythonpath, REPO])))
    return subprocess.run([sys.executable, "-m", "toolaudit", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_replay_through_a_plugin_engine(site, paths_file, tmp_path):
    db = tmp_path / "echo.duckdb"
    done = toolaudit("replay", str(DEMO), "--paths", str(paths_file), "--baseline", "echo-first", "--candidate",
                     "echo-last", "--limit", str(LIMIT), "--db", str(db), "--schemas", str(REPO / "schemas"),
                     "--json", pythonpath=[site])
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["calls"] == LIMIT and summary["status"] == "complete"
    with Store(db, read_only=True) as store:
        run = store.run_row(summary["run_id"])
        calls = store.rows("SELECT * FROM calls WHERE run_id = ? ORDER BY session_id, call_index", [run["run_id"]])
        outputs = store.rows("SELECT * FROM outputs WHERE run_id = ? ORDER BY session_id, call_index, side",
                             [run["run_id"]])
    assert len(calls) == LIMIT and len(outputs) == 2 * LIMIT
    assert all(o["parse_status"] == "ok" and o["error"] is None for o in outputs)
    tools = {(c.session_id, c.call_index): len(c.tools) for c in _demo_calls()}
    for call in calls:
        several = tools[(call["session_id"], call["call_index"])] > 1
        assert call["drifted"] == several and call["drift_kind"] == ("tool_name_changed" if several else "identical")
    assert any(c["drifted"] for c in calls)

    # engines' own output went to the log beside the database; the terminal kept toolaudit's lines
    log = tmp_path / "echo.engines.log"
    assert done.stderr.splitlines()[-1].startswith(f"engine logs: {log} (")
    assert "echo engine" not in done.stderr and "echo worker" not in done.stderr
    text = log.read_text()
    for line in ("echo engine: loading (a log record)", "FutureWarning: echo engine: a deprecated option",
                 "echo engine: loading weights", "echo engine: written to file descriptor 2", "echo worker: started",
                 "echo engine: answered"):
        assert line in text, line

    shown = toolaudit("fingerprint", "--path", "echo-last", "--paths", str(paths_file), "--json",
                      pythonpath=[site])
    assert shown.returncode == 0, shown.stderr
    fp = json.loads(shown.stdout)
    assert fp["components"] == {"engine": "echo", "pick": "last", "max_tokens": 32}
    assert fp["fingerprint"] == run["candidate_fingerprint"] != run["baseline_fingerprint"]


def test_verbose_shows_the_engines_own_output(site, paths_file, tmp_path):
    done = toolaudit("replay", str(DEMO), "--paths", str(paths_file), "--baseline", "echo-first", "--candidate",
                     "echo-last", "--limit", "2", "--db", str(tmp_path / "v.duckdb"), "--verbose",
                     pythonpath=[site])
    assert done.returncode == 0, done.stderr
    assert "echo engine: loading (a log record)" in done.stderr and "echo worker: started" in done.stderr
    assert "echo engine: loading weights" in done.stdout
    assert "engine logs:" not in done.stderr and not (tmp_path / "v.engines.log").exists()


def test_a_clashing_or_broken_plugin_spoils_only_its_own_name(site, paths_file, tmp_path):
    """Another distribution registers `echo` again and a `broken` engine whose module is missing: paths on
    those names fail naming the distributions and entry points; an openai path still works."""
    other = tmp_path / "other"
    info = other / "toolaudit_clash-0.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolaudit-clash\nVersion: 0.2\n")
    (info / "entry_points.txt").write_text("[toolaudit.engines]\necho = toolaudit_clash:ENGINE\n"
                                           "broken = toolaudit_clash_missing:ENGINE\n")
    clash = toolaudit("fingerprint", "--path", "echo-first", "--paths", str(paths_file), pythonpath=[site, other])
    assert clash.returncode == 1
    assert ("paths.toml: paths.echo-first: engine 'echo' is registered twice, by the distribution "
            "toolaudit-echo-engine (entry point echo = toolaudit_echo_engine:ENGINE in group toolaudit.engines) "
            "and the distribution toolaudit-clash (entry point echo = toolaudit_clash:ENGINE in group "
            "toolaudit.engines): uninstall one of them") in clash.stderr
    broken_paths = tmp_path / "broken.toml"
    broken_paths.write_text('[paths.b]\nengine = "broken"\n')
    broken = toolaudit("fingerprint", "--path", "b", "--paths", str(broken_paths), pythonpath=[site, other])
    assert broken.returncode == 1
    assert ("paths.b: engine 'broken' comes from the distribution toolaudit-clash (entry point broken = "
            "toolaudit_clash_missing:ENGINE in group toolaudit.engines), which failed to load: "
            "ModuleNotFoundError: No module named 'toolaudit_clash_missing'") in broken.stderr
    fine = tmp_path / "fine.toml"
    fine.write_text(openai_path_toml("remote", "http://127.0.0.1:9/v1", "m"))
    ok = toolaudit("fingerprint", "--path", "remote", "--paths", str(fine), pythonpath=[site, other])
    assert ok.returncode == 0 and ok.stdout.startswith("fp-"), ok.stderr


def _demo_calls():
    from toolaudit.replay.inputs import ReplayOptions, load_calls

    return load_calls(ReplayOptions(traces=[str(DEMO)], limit=LIMIT))[0]
