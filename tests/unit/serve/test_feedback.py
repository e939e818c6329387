"""Feedback store: rows persist across connections, ratings and choices become preference pairs."""

from __future__ import annotations

import json
import sqlite3

from tandem.serve.feedback import FeedbackStore, export_preferences, preference_pairs, vote_pairs


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
    assert len(export_preferences(tmp_path / "fb.db", tmp_path / "out.jsonl")) == 1
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


def _pair(prompt, chosen, rejected):
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def test_repeated_and_reversed_pairs_are_one_row_by_majority_vote():
    votes = vote_pairs(
        [
            _pair("p", "a", "b"),
            _pair("p", "b", "a"),  # a user who disagrees
            _pair("p", "b", "a"),  # outvotes the first
            _pair("q", "x", "y"),
            _pair("q", "x", "y"),  # the same pair sent twice
            _pair("r", "m", "n"),
            _pair("r", "n", "m"),  # a tie: nothing to learn
            _pair("s", "a", "b"),  # same texts, another prompt: its own pair
        ]
    )
    assert votes.pairs == [_pair("p", "b", "a"), _pair("q", "x", "y"), _pair("s", "a", "b")]
    assert (votes.repeats, votes.outvoted, votes.tied) == (2, 1, 2)


def test_the_export_votes_unless_asked_for_every_row_as_sent(tmp_path):
    from typer.testing import CliRunner

    from tandem.cli.main import app

    store = FeedbackStore(tmp_path / "fb.db")
    for rid, chosen, rejected in (("a", "2", "3"), ("b", "2", "3"), ("c", "3", "2")):
        store.add(
            response_id=rid,
            prompt="1+1=",
            arm="main",
            other_id="z",
            preferred=rid,
            chosen=chosen,
            rejected=rejected,
        )
    store.close()
    out = tmp_path / "prefs.jsonl"
    result = CliRunner().invoke(app, ["data", "export-feedback", str(tmp_path / "fb.db"), "--out", str(out)])
    assert result.exit_code == 0 and "wrote 1 preference rows" in result.output, result.output
    assert "1 repeated rows merged, 1 outvoted and 0 tied rows dropped" in " ".join(result.output.split())
    assert [json.loads(line) for line in out.read_text().splitlines()] == [_pair("1+1=", "2", "3")]
    every = CliRunner().invoke(
        app, ["data", "export-feedback", str(tmp_path / "fb.db"), "--out", str(out), "--as-sent"]
    )
    assert every.exit_code == 0 and "wrote 3 preference rows" in every.output, every.output
    assert len(out.read_text().splitlines()) == 3
