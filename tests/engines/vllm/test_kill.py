"""kill -9 of a vLLM replay, then `replay --resume`: the tables equal the uninterrupted float32 run of the
session (`conftest.vllm_replays`, same paths, calls and chunks).

One seeded point, not twelve: each point costs three vLLM model loads (~25-30 s each on 2 cores), and what a
vLLM replay writes goes through the path-major schedule that tests/store/test_kill.py kills at 12 points with the torch
engine. The point is the one only a real vLLM run has: the baseline path wholly decoded and staged, released,
the candidate loaded and one of its two chunks paired, the other not. The kill is keyed to the replay's own
progress lines (12 of 16 decodes stored), not to time; the whole process group is killed, vLLM's engine
process included, as when a node dies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner
from helpers import DEMO, REPO

from toolaudit.cli import cli
from toolaudit.store import Store

from .conftest import paths_toml

pytestmark = pytest.mark.slow

PROGRESS = re.compile(r"replaying: (\d+)/")
KILL_AT = 12  # decodes stored of 2 x 8: the baseline staged, the candidate's first chunk of 4 paired


def stored(db, run_id: int) -> dict:
    """What the run holds, without ids, times and wall-clock figures."""
    with Store(db, read_only=True) as store:
        calls = store.query("""SELECT session_id, call_index, match_status, drifted, drift_kind, first_divergence,
                                      baseline_margin, candidate_margin
                               FROM calls WHERE run_id = ? ORDER BY ALL""", [run_id])[1]
        outputs = store.query("""SELECT session_id, call_index, side, path_name, text, tool_calls, parse_status,
                                        token_ids, completion_tokens, error
                                 FROM outputs WHERE run_id = ? ORDER BY ALL""", [run_id])[1]
        diffs = store.query("""SELECT session_id, call_index, call_position, tool_name, arg_path, diff_kind
                               FROM arg_diffs WHERE run_id = ? ORDER BY ALL""", [run_id])[1]
        staged = store.query("SELECT count(*) FROM staged_results WHERE run_id = ?", [run_id])[1][0][0]
        status = store.run_row(run_id)["status"]
    return {"calls": calls, "outputs": outputs, "diffs": diffs, "staged": staged, "status": status}


def test_killed_vllm_replay_resumes_to_the_uninterrupted_run(vllm_replays, tmp_path, show_table):
    pair, reference = vllm_replays["float32"]["pair"], vllm_replays["float32"]["run_id"]
    paths = tmp_path / "paths.toml"  # both sides in process: three loads without vLLM's process start-ups
    paths.write_text(paths_toml(in_process=("baseline", "candidate")))
    db = tmp_path / "killed.duckdb"
    args = ["replay", str(DEMO), "--paths", str(paths), "--baseline", pair.baseline, "--candidate", pair.candidate,
            "--db", str(db), "--limit", str(pair.calls), "--schemas", str(REPO / "schemas"), "--chunk", "4"]
    proc = subprocess.Popen([sys.executable, "-m", "toolaudit", *args], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen, reported = 0, []
    try:
        for line in proc.stderr:  # vLLM's own progress bars share stderr, carriage returns and all
            for match in PROGRESS.finditer(line):
                seen = int(match.group(1))
                reported.append(line.strip())
            if seen >= KILL_AT:
                os.killpg(proc.pid, signal.SIGKILL)  # toolaudit and vLLM's engine process at once
                break
    finally:
        proc.wait(timeout=600)
        proc.stderr.close()
    assert seen == KILL_AT and proc.returncode == -signal.SIGKILL, reported
    left = stored(db, 1)
    assert left["status"] == "running" and len(left["calls"]) == 4 and left["staged"] == pair.calls - 4
    assert {o[:3] for o in left["outputs"]} == {(c[0], c[1], side) for c in left["calls"]
                                                for side in ("baseline", "candidate")}  # no call lacks outputs

    result = CliRunner().invoke(cli, ["replay", "--resume", "1", "--db", str(db), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["status"] == "complete"
    resumed, want = stored(db, 1), stored(vllm_replays["db"], reference)
    assert resumed == want
    show_table(f"kill -9: vLLM replay (float32 target vs n-gram, {pair.calls} calls, chunks of 4), killed after "
               f"{seen} of {2 * pair.calls} decodes: {len(left['calls'])} calls paired and {left['staged']} "
               f"baseline results staged; resumed: {len(resumed['calls'])} calls equal to the uninterrupted run, "
               f"calls lacking outputs 0, duplicated 0")
