"""The scenario the report tests read: three customers, a candidate run with token evidence (run 1) and a
noise-floor run (run 2)."""

from __future__ import annotations

from pathlib import Path

from conftest import line, tool_call, write_jsonl

from toolaudit.compare.logs import CompareOptions, compare_logs
from toolaudit.store import Store

HOSTILE = '<script>alert("zephyr")</script>|pipe'

# Each customer's ids and values are distinctive: the customer's first word appears in all of them, and
# nowhere else, so "zephyr" in another customer's report is a leak.
CUSTOMERS = {
    "Zephyr Logistics": {"word": "zephyr", "query": "zephyr-cargo-manifest", "ticket": 7700100},
    "Quokka Mutual": {"word": "quokka", "query": "quokka-claim-dossier", "ticket": 4400100},
    "Walrus Freight": {"word": "walrus", "query": "walrus-ledger-entry", "ticket": 9000100},
}


def _calls(c: dict, s: int) -> list[tuple[str, dict]]:
    return [("search_tickets", {"query": f"{c['query']}-{s}", "limit": 5}),
            ("close_ticket", {"ticket_id": c["ticket"] + s}),
            ("search_tickets", {"query": f"{c['query']}-followup-{s}", "limit": 10,
                                "filters": {"status": ["open"]}})]


# (customer, session, call) -> candidate's (tool, arguments)
DRIFTS = {
    ("Zephyr Logistics", 0, 0): ("search_tickets", {"query": "zephyr-cargo-manifest-0", "limit": 50}),
    ("Zephyr Logistics", 1, 2): ("search_tickets", {"query": HOSTILE, "limit": 10,
                                                    "filters": {"status": ["open"]}}),
    ("Zephyr Logistics", 2, 1): ("close_ticket", {"ticket_id": "7700102"}),
    ("Zephyr Logistics", 3, 0): ("close_ticket", {"ticket_id": 7700103}),
    ("Quokka Mutual", 0, 0): ("search_tickets", {"query": "quokka-claim-dossier-0", "limit": 6}),
    ("Quokka Mutual", 4, 2): ("search_tickets", {"query": "quokka-claim-dossier-followup-4", "limit": 10,
                                                 "filters": {"status": ["closed"]}}),
    ("Walrus Freight", 5, 1): ("close_ticket", {"ticket_id": 9000106}),
}
# Baseline margins at the first divergent token (run 1); Walrus has no token evidence at all.
MARGINS = {("Zephyr Logistics", 0, 0): 3.5, ("Zephyr Logistics", 1, 2): 0.4, ("Zephyr Logistics", 2, 1): 0.0,
           ("Quokka Mutual", 0, 0): 0.2, ("Quokka Mutual", 4, 2): 0.05}


def session_id(customer: str, s: int) -> str:
    return f"{CUSTOMERS[customer]['word']}-sess-{s:03d}"


def _logs(tmp_path: Path, drifts: dict, name: str) -> Path:
    records = []
    for customer, c in CUSTOMERS.items():
        for s in range(6):
            for i, (tool, args) in enumerate(_calls(c, s)):
                tool, args = drifts.get((customer, s, i), (tool, args))
                records.append(line(session=session_id(customer, s), customer=customer,
                                    calls=[tool_call(tool, args)]))
    return write_jsonl(tmp_path / f"{name}.jsonl", records)


def build_db(tmp_path: Path, db_path: Path) -> None:
    """Run 1: candidate vs baseline with token evidence; run 2: noise floor (the baseline against itself)."""
    base = _logs(tmp_path, {}, "baseline")
    cand = _logs(tmp_path, DRIFTS, "candidate")
    noise_drift = ("search_tickets", {"query": "zephyr-cargo-manifest-5", "limit": 7})
    noise = _logs(tmp_path, {("Zephyr Logistics", 5, 0): noise_drift}, "noise")
    with Store(db_path) as store:
        compare_logs(store, base, cand, CompareOptions(schema_dir=None, run_name="nightly",
                                                       baseline_name="target", candidate_name="target+ngram"))
        compare_logs(store, base, noise, CompareOptions(schema_dir=None, run_name="noise",
                                                        baseline_name="target", candidate_name="target"))
        for (customer, s, i), margin in MARGINS.items():
            store.con.execute("""UPDATE calls SET first_divergence = 3, baseline_token = ' 5',
                candidate_token = ' 50', baseline_margin = ?, candidate_margin = 0.1
                WHERE run_id = 1 AND session_id = ? AND call_index = ?""",
                              [margin, session_id(customer, s), i])
        store.con.execute("""UPDATE calls SET baseline_margin = 0.125 WHERE run_id = 2 AND drifted""")
        # Decode evidence for the replayed customers only: Walrus stays a recorded log (no speed, no drafts).
        store.con.execute("""UPDATE outputs SET completion_tokens = 20,
                latency_s = CASE side WHEN 'baseline' THEN 0.5 ELSE 0.25 END,
                tokens_per_s = CASE side WHEN 'baseline' THEN 40.0 ELSE 80.0 END,
                drafted_tokens = CASE side WHEN 'candidate' THEN 10 END,
                accepted_tokens = CASE side WHEN 'candidate' THEN 6 END
            WHERE run_id = 1 AND session_id NOT LIKE 'walrus%'""")
        # One Quokka call the candidate engine failed: an error row, never drift.
        store.con.execute("""INSERT INTO calls (run_id, session_id, call_index, customer, match_status,
            detail) VALUES (1, 'quokka-sess-000', 9, 'Quokka Mutual', 'error', 'candidate: out of memory')""")
        store.con.execute("""INSERT INTO outputs (run_id, session_id, call_index, side, path_name, error)
            VALUES (1, 'quokka-sess-000', 9, 'baseline', 'target', NULL),
                   (1, 'quokka-sess-000', 9, 'candidate', 'target+ngram', 'out of memory')""")
        store.con.execute("""UPDATE runs SET baseline_fingerprint = 'fp-target-0001',
            candidate_fingerprint = 'fp-spec-0002' WHERE run_id = 1""")
