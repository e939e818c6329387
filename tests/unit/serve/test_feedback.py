"""Feedback store: rows persist across connections, ratings and choices become preference pairs."""

from __future__ import annotations

import json
import sqlite3

from tandem.serve.feedback import FeedbackStore, export_preferences, preference_pairs


def test_store_uses_wal_and_rows_survive_reopen(tmp_path):
    db = tmp_path / "fb.db"
    store = FeedbackStore(db)
    store.remember("r1", "main", ["p", "p"], ["good", "bad"])
    store.add(response_id="r1", prompt="p", arm="main", choice_index=0, rating=1.0, chosen="good")
    # no close(): a second connection (another process after a crash) sees the committed row
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert FeedbackStore(db).rows()[0]["chosen"] == "good"
    assert FeedbackStore(db).lookup("r1") == ("main", ["p", "p"], ["good", "bad"])


def test_ratings_pair_best_with_worst_across_threshold():
    rows = [
        {"prompt": "p", "rating": 1.0, "chosen": "good", "rejected": None},
        {"prompt": "p", "rating": 0.0, "chosen": "bad", "rejected": None},
        {"prompt": "q", "rating": 1.0, "chosen": "only", "rejected": None},  # nothing to pair with
        {"prompt": "r", "rating": 0.9, "chosen": "x", "rejected": None},
        {"prompt": "r", "rating": 0.8, "chosen": "y", "rejected": None},  # both above the threshold
        {"prompt": "s", "rating": None, "chosen": "a", "rejected": "b"},
    ]
    assert preference_pairs(rows, threshold=0.5) == [
        {"prompt": "s", "chosen": "a", "rejected": "b"},
        {"prompt": "p", "chosen": "good", "rejected": "bad"},
    ]


def test_export_writes_jsonl(tmp_path):
    store = FeedbackStore(tmp_path / "fb.db")
    store.remember("a", "main", ["p"], ["x"])
    store.add(response_id="a", prompt="p", arm="main", other_id="b", preferred="a", chosen="x", rejected="y")
    assert export_preferences(tmp_path / "fb.db", tmp_path / "out.jsonl") == 1
    assert json.loads((tmp_path / "out.jsonl").read_text()) == {"prompt": "p", "chosen": "x", "rejected": "y"}


def test_a_database_an_earlier_server_wrote_gains_the_other_index_column(tmp_path):
    """A feedback table without ``other_index`` (written before pairs of choices existed) is extended on
    open, keeping its rows; a pair of two choices of one response is stored with both indices."""
    db = tmp_path / "old.db"
    old = sqlite3.connect(db)
    old.executescript(
        "CREATE TABLE feedback (rowid INTEGER PRIMARY KEY AUTOINCREMENT, response_id TEXT, choice_index INTEGER,"
        " rating REAL, other_id TEXT, preferred TEXT, prompt TEXT, arm TEXT, chosen TEXT, rejected TEXT,"
        " created REAL);"
        "INSERT INTO feedback (response_id, rating, prompt, chosen) VALUES ('r0', 1.0, 'p', 'kept');"
    )
    old.commit()
    old.close()
    store = FeedbackStore(db)
    store.add(
        response_id="r1", prompt="p", arm="main", choice_index=1, other_id="r1", other_index=0,
        preferred="r1", chosen="b", rejected="a",
    )  # fmt: skip
    rows = store.rows()
    assert [(r["response_id"], r["chosen"], r["other_index"]) for r in rows] == [
        ("r0", "kept", None),
        ("r1", "b", 0),
    ]
