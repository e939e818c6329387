"""Durable user feedback in SQLite (WAL journal, synchronous=FULL): ratings and pairwise choices.

Every completion the server answers is remembered (response id, arm, prompt, responses) in the same
database, so ``POST /v1/feedback`` can refer to it by id alone and the feedback row keeps the text even
after a restart. With WAL and ``synchronous=FULL`` a committed row survives ``kill -9`` of the server.
:func:`export_preferences` turns feedback into ``prompt``/``chosen``/``rejected`` rows (the TRL
preference format ``tandem dpo`` reads). Chat requests also record their conversation (messages, tool
declarations, each choice's assistant message with its tool calls, and the exact prompt and completion
text); :func:`export_conversations` writes them as training rows.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tandem.utils.io import atomic_write_text

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, arm TEXT, prompt TEXT, responses TEXT, created REAL);
CREATE TABLE IF NOT EXISTS feedback (
  rowid INTEGER PRIMARY KEY AUTOINCREMENT, response_id TEXT, choice_index INTEGER, rating REAL,
  other_id TEXT, preferred TEXT, prompt TEXT, arm TEXT, chosen TEXT, rejected TEXT, created REAL,
  other_index INTEGER);
CREATE TABLE IF NOT EXISTS conversations (
  id TEXT PRIMARY KEY, arm TEXT, prompt TEXT, messages TEXT, tools TEXT, choices TEXT, created REAL);
"""


RATING_MIN, RATING_MAX = -1.0, 1.0  # e.g. 1 / 0 or 1 / -1 for thumbs up / down


def check_rating(value: object) -> float:
    """``value`` as a rating: a finite number in ``[RATING_MIN, RATING_MAX]`` (JSON also carries ``NaN``
    and ``1e400``, which SQLite would store as NULL and Inf); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("'rating' must be a number (or send other_id + preferred)")
    rating = float(value)
    if not (math.isfinite(rating) and RATING_MIN <= rating <= RATING_MAX):
        raise ValueError(f"'rating' must be a finite number in [{RATING_MIN:g}, {RATING_MAX:g}], got {value}")
    return rating


def check_pair(
    response_id: str, other_id: str, chosen: str, rejected: str, index: int = 0, other_index: int = 0
) -> None:
    """ValueError for a pairwise choice that teaches nothing: a completion (choice ``index`` of a response)
    paired with itself, or two completions with the same text (a chosen == rejected row that ``tandem data
    validate`` rejects). Two choices of one response (``n`` > 1) make a pair."""
    if response_id == other_id and index == other_index:
        raise ValueError(
            "a completion cannot be paired with itself: name a different response ('other_id') "
            "or another choice of this one ('other_index')"
        )
    if chosen == rejected:
        raise ValueError("the two responses have the same text; there is nothing to prefer")


@dataclass(frozen=True)
class Conversation:
    """A chat request as recorded: the rendered ``prompt`` text, the request's ``messages`` and ``tools``
    (OpenAI shapes), and per choice ``{"message", "completion", "finish_reason"}``."""

    prompt: str
    messages: list[dict]
    tools: list[dict]
    choices: list[dict]

    def columns(self) -> tuple[str, str, str, str]:
        return self.prompt, json.dumps(self.messages), json.dumps(self.tools), json.dumps(self.choices)


class FeedbackStore:
    """SQLite-backed store; one connection guarded by a lock (requests come from one event loop)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(feedback)")}
        if "other_index" not in columns:  # a database an earlier server wrote
            self._db.execute("ALTER TABLE feedback ADD COLUMN other_index INTEGER")
        self._lock = threading.Lock()

    @classmethod
    def reader(cls, path: str | Path, table: str) -> FeedbackStore:
        """The database at ``path`` opened read-only, for an export: nothing in the file changes (a store
        opened for writing would add its tables to any SQLite file). ``sqlite3.DatabaseError`` for a file
        that is not a database; ValueError when it lacks ``table`` (not a feedback database, or one an
        older server wrote without it)."""
        store = cls.__new__(cls)
        store.path = str(path)
        store._db = sqlite3.connect(
            f"{Path(path).resolve().as_uri()}?mode=ro",
            uri=True,
            check_same_thread=False,
            isolation_level=None,
        )
        store._lock = threading.Lock()
        try:
            found = store._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
        except sqlite3.DatabaseError:
            store.close()
            raise
        if found is None:
            store.close()
            raise ValueError(f"no '{table}' table: not a database that tandem serve --feedback-db wrote")
        return store

    def remember(
        self,
        response_id: str,
        arm: str,
        prompts: list[str],
        responses: list[str],
        conversation: Conversation | None = None,
    ) -> None:
        """Store a completion: the prompt and text of each of its choices, and a chat request's
        ``conversation`` in the same transaction (one durable commit per request)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                    (response_id, arm, json.dumps(prompts), json.dumps(responses), time.time()),
                )
                if conversation is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO conversations VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (response_id, arm, *conversation.columns(), time.time()),
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def conversations(self) -> list[dict]:
        """Every recorded conversation, oldest first (JSON columns decoded)."""
        with self._lock:
            cur = self._db.execute(
                "SELECT id, arm, prompt, messages, tools, choices FROM conversations ORDER BY created, rowid"
            )
            rows = cur.fetchall()
        return [
            {"id": r[0], "arm": r[1], "prompt": r[2], "messages": json.loads(r[3]), "tools": json.loads(r[4]),
             "choices": json.loads(r[5])}
            for r in rows
        ]  # fmt: skip

    def lookup(self, response_id: str) -> tuple[str, list[str], list[str]] | None:
        """(arm, prompt of each choice, text of each choice) of a remembered completion."""
        with self._lock:
            row = self._db.execute(
                "SELECT arm, prompt, responses FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        return None if row is None else (row[0], json.loads(row[1]), json.loads(row[2]))

    def add(
        self,
        *,
        response_id: str,
        prompt: str,
        arm: str,
        choice_index: int = 0,
        rating: float | None = None,
        chosen: str | None = None,
        rejected: str | None = None,
        other_id: str | None = None,
        other_index: int | None = None,
        preferred: str | None = None,
    ) -> int:
        """Insert one feedback row (committed before returning); returns its row id. ValueError for a
        rating or pair that :func:`check_rating` / :func:`check_pair` refuse."""
        if rating is not None:
            rating = check_rating(rating)
        if chosen is not None and rejected is not None:
            check_pair(response_id, other_id or "", chosen, rejected, choice_index, other_index or 0)
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO feedback (response_id, choice_index, rating, other_id, other_index, preferred, prompt,"
                " arm, chosen, rejected, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    response_id,
                    choice_index,
                    rating,
                    other_id,
                    other_index,
                    preferred,
                    prompt,
                    arm,
                    chosen,
                    rejected,
                    time.time(),
                ),
            )
            return int(cur.lastrowid)

    def rows(self) -> list[dict]:
        """Every feedback row as a dict, oldest first."""
        with self._lock:
            cur = self._db.execute("SELECT * FROM feedback ORDER BY rowid")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def close(self) -> None:
        self._db.close()


def preference_pairs(rows: list[dict], threshold: float = 0.5) -> list[dict]:
    """Preference rows from feedback: explicit pairwise choices as they are; ratings of completions of the
    same prompt paired best-vs-worst when their ratings differ and straddle ``threshold``. Rows written
    before ratings and pairs were validated (non-finite ratings, chosen == rejected) are skipped."""
    pairs = [
        {"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
        for r in rows
        if r["chosen"] is not None and r["rejected"] is not None and r["chosen"] != r["rejected"]
    ]
    rated: dict[str, list[tuple[float, str]]] = {}
    for r in rows:
        rating = r["rating"]
        if rating is not None and math.isfinite(rating) and r["chosen"] is not None and r["rejected"] is None:
            rated.setdefault(r["prompt"], []).append((float(rating), r["chosen"]))
    for prompt, items in rated.items():
        items.sort()
        (low, worst), (high, best) = items[0], items[-1]
        if high > low and high >= threshold > low and best != worst:
            pairs.append({"prompt": prompt, "chosen": best, "rejected": worst})
    return pairs


@dataclass(frozen=True)
class PairVotes:
    """Preference rows with each pair of texts counted once: a majority vote over the rows that compare the
    same two texts for the same prompt (repeats, and users who disagree)."""

    pairs: list[dict]  # one row per prompt and pair of texts: the direction most rows chose
    repeats: int = 0  # rows restating a kept row's direction (merged into it)
    outvoted: int = 0  # rows whose direction lost the vote (dropped)
    tied: int = 0  # rows of pairs with as many votes each way (all dropped: nothing to learn)

    def __len__(self) -> int:
        return len(self.pairs)


def vote_pairs(pairs: list[dict]) -> PairVotes:
    """``pairs`` (``prompt``/``chosen``/``rejected``) with the rows comparing the same two texts for the
    same prompt merged into one, in the direction most of them chose; a tie drops them all. Rows keep the
    order of each pair's first occurrence."""
    groups: dict[tuple[str, frozenset[str]], list[dict]] = {}
    for pair in pairs:
        groups.setdefault((pair["prompt"], frozenset((pair["chosen"], pair["rejected"]))), []).append(pair)
    kept: list[dict] = []
    repeats = outvoted = tied = 0
    for rows in groups.values():
        first = rows[0]
        forward = [r for r in rows if r["chosen"] == first["chosen"]]
        backward = [r for r in rows if r["chosen"] != first["chosen"]]
        if len(forward) == len(backward):
            tied += len(rows)
            continue
        winners, losers = (forward, backward) if len(forward) > len(backward) else (backward, forward)
        kept.append(winners[0])
        repeats += len(winners) - 1
        outvoted += len(losers)
    return PairVotes(kept, repeats, outvoted, tied)


def export_preferences(
    db_path: str | Path, out: str | Path, threshold: float = 0.5, *, as_sent: bool = False
) -> PairVotes:
    """Write the preference JSONL of ``db_path`` to ``out`` atomically: one row per prompt and pair of
    texts, by majority vote (:func:`vote_pairs`), or every row as users sent it (``as_sent``). The database
    is only read."""
    store = FeedbackStore.reader(db_path, "feedback")
    try:
        pairs = preference_pairs(store.rows(), threshold)
    finally:
        store.close()
    result = PairVotes(pairs) if as_sent else vote_pairs(pairs)
    atomic_write_text(out, "".join(json.dumps(p) + "\n" for p in result.pairs))
    return result


def conversation_rows(conversations: list[dict]) -> list[dict]:
    """One training row per recorded choice: ``messages`` (the conversation plus the assistant message,
    its ``tool_calls`` included) and ``tools`` in TRL's conversational-with-tools format, and ``prompt`` /
    ``completion``, the exact text the model read and wrote (what ``tandem sft`` trains on), plus
    ``response_id``, ``arm`` and ``finish_reason``. Cancelled choices are skipped."""
    rows = []
    for conv in conversations:
        for choice in conv["choices"]:
            if choice.get("finish_reason") == "cancelled":
                continue
            message = {k: v for k, v in choice["message"].items() if v is not None and k != "refusal"}
            rows.append(
                {
                    "messages": [*conv["messages"], message],
                    "tools": conv["tools"],
                    "prompt": conv["prompt"],
                    "completion": choice["completion"],
                    "response_id": conv["id"],
                    "arm": conv["arm"],
                    "finish_reason": choice.get("finish_reason"),
                }
            )
    return rows


def export_conversations(db_path: str | Path, out: str | Path) -> int:
    """Write the recorded chat conversations of ``db_path`` to ``out`` as JSONL (atomically, see
    :func:`conversation_rows`); returns the number of rows. The database is only read."""
    store = FeedbackStore.reader(db_path, "conversations")
    try:
        rows = conversation_rows(store.conversations())
    finally:
        store.close()
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)
