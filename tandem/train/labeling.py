"""RLAIF: label response pairs with a judge and keep only swap-consistent verdicts.

A judge answers "which of two responses to a prompt is better": ``"a"``, ``"b"``, or ``None`` when it
cannot say (tie, unparseable reply). Three judges:

- :class:`RuleJudge` — a rule or verifier ``score(prompt, completion, row) -> float``; higher wins;
- :class:`HFJudge` — a local HF causal LM prompted as a judge; the verdict is whichever of the tokens
  ``A`` / ``B`` is more likely as the next token (no free-text parsing);
- :class:`HTTPJudge` — any OpenAI-compatible ``/chat/completions`` endpoint, with a timeout, retries on
  timeouts / 429 / 5xx with exponential backoff, and a reply parser.

:func:`label_rows` judges each pair in both orders ((a, b) and (b, a)); the pair is kept only if both
verdicts name the same response (position bias and judge noise are filtered out). Progress is appended
to ``<out>.progress.jsonl`` one line per row, fsynced, so a crashed run resumes where it stopped and
never judges a row twice. Counts: agreement rate, parse failures, timeouts, errors.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from tandem.errors import DataError

Verdict = str | None  # "a", "b" or None (no usable verdict)

JUDGE_TEMPLATE = (
    "Which response answers the prompt better? Reply with A or B only.\n"
    "Prompt: {prompt}\nResponse A: {a}\nResponse B: {b}\nBetter response:"
)


class JudgeTimeoutError(Exception):
    """The judge did not answer within its timeout, after all retries."""


class JudgeParseError(Exception):
    """The judge answered, but not with a usable verdict."""


class Judge(Protocol):
    def __call__(self, prompt: str, a: str, b: str, row: dict[str, Any]) -> Verdict: ...


class RuleJudge:
    """Verdict from a scoring rule: the response with the higher score wins; equal scores -> None."""

    def __init__(self, score: Callable[[str, str, dict[str, Any]], float]) -> None:
        self.score = score

    def __call__(self, prompt: str, a: str, b: str, row: dict[str, Any]) -> Verdict:
        sa, sb = self.score(prompt, a, row), self.score(prompt, b, row)
        return None if sa == sb else "a" if sa > sb else "b"


def task_rule(task: Any) -> Callable[[str, str, dict[str, Any]], float]:
    """A built-in task's verifier as a rule: ``task.reward`` on one completion with the row's columns."""

    def score(prompt: str, completion: str, row: dict[str, Any]) -> float:
        cols = {
            k: [v] for k, v in row.items() if k not in ("prompt", "response_a", "response_b", "completions")
        }
        value = task.reward([prompt], [completion], **cols)[0]
        return float(value or 0.0)

    return score


class HFJudge:
    """A local causal LM as judge: compares the next-token log-probs of ``A`` and ``B`` after
    :data:`JUDGE_TEMPLATE` (one forward pass, nothing to parse)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, template: str = JUDGE_TEMPLATE) -> None:
        self.model, self.tokenizer, self.template = model.eval(), tokenizer, template
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("A", "B")]
        if any(len(i) != 1 for i in ids):
            raise DataError("judge tokenizer must encode 'A' and 'B' as single tokens", where="judge.model")
        self.a_id, self.b_id = ids[0][0], ids[1][0]

    def __call__(self, prompt: str, a: str, b: str, row: dict[str, Any]) -> Verdict:
        text = self.template.format(prompt=prompt, a=a, b=b) + " "
        ids = torch.tensor([self.tokenizer(text, add_special_tokens=False)["input_ids"]])  # [1, T]
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, -1]  # [V]
        la, lb = float(logits[self.a_id]), float(logits[self.b_id])
        return None if la == lb else "a" if la > lb else "b"


def parse_verdict(text: str) -> Verdict:
    """``"a"``/``"b"`` from a judge reply such as ``"A"``, ``"Response B."``, ``"b"``; JudgeParseError
    when the reply names neither or both."""
    found = set(re.findall(r"\b([AB])\b", text.strip().upper()))
    if len(found) != 1:
        raise JudgeParseError(f"cannot read a verdict from {text[:60]!r}")
    return found.pop().lower()


@dataclass
class HTTPJudge:
    """An OpenAI-compatible chat endpoint as judge (``POST {base_url}/chat/completions``)."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5
    template: str = JUDGE_TEMPLATE
    sleep: Callable[[float], None] = time.sleep

    def __call__(self, prompt: str, a: str, b: str, row: dict[str, Any]) -> Verdict:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.template.format(prompt=prompt, a=a, b=b)}],
            "max_tokens": 8,
            "temperature": 0.0,
        }
        reply = self._post(json.dumps(body).encode())
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeParseError("reply has no choices[0].message.content") from None
        return parse_verdict(str(content))

    def _post(self, data: bytes) -> dict[str, Any]:
        """POST with retries: timeouts, connection errors, 429 and 5xx are retried after
        ``backoff_s * 2**attempt`` seconds; other 4xx fail at once (a retry would not help)."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read().decode())
            except urllib.error.HTTPError as err:
                if err.code != 429 and err.code < 500:
                    raise JudgeParseError(f"HTTP {err.code} from judge") from None
                last = f"HTTP {err.code}"
            except (TimeoutError, urllib.error.URLError) as err:
                reason = getattr(err, "reason", err)
                if not isinstance(reason, TimeoutError) and "timed out" not in str(reason):
                    last = f"connection error ({reason})"
                    continue
                last = "timeout"
            except json.JSONDecodeError:
                raise JudgeParseError("judge reply is not JSON") from None
        if last == "timeout":
            raise JudgeTimeoutError(f"judge timed out after {self.max_retries + 1} attempts")
        raise JudgeTimeoutError(f"judge failed after {self.max_retries + 1} attempts: {last}")


@dataclass
class LabelStats:
    rows: int = 0  # rows judged in this call (resumed rows not included)
    resumed: int = 0  # rows skipped because the progress file already had them
    kept: int = 0
    disagreements: int = 0
    parse_failures: int = 0
    timeouts: int = 0
    ties: int = 0
    empty: int = 0  # pairs with an empty answer (a policy that sampled nothing), skipped
    label_correct_single: int = 0  # first-order verdict matches the row's 'gold' (when present)
    label_correct_kept: int = 0
    gold_rows: int = 0  # rows with a 'gold' label and a first-order verdict
    gold_kept: int = 0  # of those, rows kept by the swap-consistency filter

    @property
    def accuracy_single(self) -> float:
        """Label accuracy of one first-order verdict per row (no filter), against 'gold'."""
        return self.label_correct_single / self.gold_rows if self.gold_rows else float("nan")

    @property
    def accuracy_kept(self) -> float:
        """Label accuracy of the rows kept by the swap-consistency filter, against 'gold'."""
        return self.label_correct_kept / self.gold_kept if self.gold_kept else float("nan")

    @property
    def agreement_rate(self) -> float:
        judged = self.kept + self.disagreements
        return self.kept / judged if judged else float("nan")


def row_pair(row: dict[str, Any], where: str) -> tuple[str, str, str]:
    """``(prompt, a, b)`` of a row with ``response_a``/``response_b`` or a two-item ``completions``."""
    if isinstance(row.get("completions"), list) and len(row["completions"]) == 2:
        a, b = row["completions"]
    else:
        a, b = row.get("response_a"), row.get("response_b")
    prompt = row.get("prompt")
    if not all(isinstance(x, str) and x for x in (prompt, a, b)):
        raise DataError(
            "a row needs string 'prompt' and 'response_a'/'response_b' (or 2 'completions')", where=where
        )
    return prompt, a, b  # type: ignore[return-value]


def _noisy(verdict: Verdict, rng: random.Random, noise: float) -> Verdict:
    """Flip a verdict with probability ``noise`` (simulated judge noise)."""
    if verdict is None or noise <= 0 or rng.random() >= noise:
        return verdict
    return "b" if verdict == "a" else "a"


def judge_row(
    judge: Judge, row: dict[str, Any], where: str, *, both_orders: bool, noise: float, seed: int
) -> dict[str, Any]:
    """One row's decision: ``{"status": kept|disagree|tie|parse_failure|timeout|empty, "first": verdict,
    ...}``. ``empty``: one of two ``completions`` (a policy's samples) is empty — nothing to compare, so the
    row is skipped and counted rather than blamed on the input file."""
    pair = row.get("completions")
    if "response_a" not in row and isinstance(pair, list) and len(pair) == 2 and "" in pair:
        return {"status": "empty"}
    prompt, a, b = row_pair(row, where)
    rng = random.Random(f"{seed}|{where}")
    try:
        first = _noisy(judge(prompt, a, b, row), rng, noise)
        swapped = _noisy(judge(prompt, b, a, row), rng, noise) if both_orders else None
    except JudgeTimeoutError as err:
        return {"status": "timeout", "error": str(err)}
    except JudgeParseError as err:
        return {"status": "parse_failure", "error": str(err)}
    if first is None or (both_orders and swapped is None):
        return {"status": "tie"}
    second = None if swapped is None else ("b" if swapped == "a" else "a")  # back to (a, b) orientation
    if both_orders and second != first:
        return {"status": "disagree", "first": first}
    chosen, rejected = (a, b) if first == "a" else (b, a)
    return {
        "status": "kept",
        "first": first,
        "pair": {"prompt": prompt, "chosen": chosen, "rejected": rejected},
    }


def _read_progress(path: Path) -> dict[str, dict[str, Any]]:
    """Decisions already recorded; a torn last line (crash mid-write) is ignored and re-judged."""
    done: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[rec["id"]] = rec
    return done


def _append_line(path: Path, obj: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def label_rows(
    rows: Sequence[tuple[str, dict[str, Any]]],
    judge: Judge,
    out_file: str | Path,
    *,
    both_orders: bool = True,
    noise: float = 0.0,
    seed: int = 0,
    on_row: Callable[[int, int], None] | None = None,
) -> LabelStats:
    """Judge ``(where, row)`` items; kept pairs go to ``out_file`` (JSONL, rewritten atomically from the
    progress log at the end). Rows with a ``gold`` column ("a"/"b") also measure label accuracy of the
    single first-order verdict vs the swap-consistent kept labels."""
    from tandem.utils.io import atomic_write_text

    out = Path(out_file)
    progress = out.with_name(out.name + ".progress.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _read_progress(progress)
    stats = LabelStats()
    for i, (where, row) in enumerate(rows):
        rid = _row_id(where, row)
        if rid in done:
            stats.resumed += 1
        else:
            rec = {
                "id": rid,
                "where": where,
                **judge_row(judge, row, where, both_orders=both_orders, noise=noise, seed=seed),
            }
            if "gold" in row:
                rec["gold"] = row["gold"]
            _append_line(progress, rec)
            done[rid] = rec
            stats.rows += 1
        if on_row is not None:
            on_row(i + 1, len(rows))
    kept_lines = []
    for where, row in rows:
        rec = done[_row_id(where, row)]
        _tally(stats, rec)
        if rec["status"] == "kept":
            kept_lines.append(json.dumps(rec["pair"], ensure_ascii=False))
    atomic_write_text(out, "".join(line + "\n" for line in kept_lines))
    return stats


def _row_id(where: str, row: dict[str, Any]) -> str:
    import hashlib

    return hashlib.blake2b(
        json.dumps([where, row], sort_keys=True, default=str).encode(), digest_size=12
    ).hexdigest()


def _tally(stats: LabelStats, rec: dict[str, Any]) -> None:
    status = rec["status"]
    stats.kept += status == "kept"
    stats.disagreements += status == "disagree"
    stats.parse_failures += status == "parse_failure"
    stats.timeouts += status == "timeout"
    stats.ties += status == "tie"
    stats.empty += status == "empty"
    if "gold" in rec and rec.get("first") is not None:
        stats.gold_rows += 1
        stats.label_correct_single += rec["first"] == rec["gold"]
        if status == "kept":
            stats.gold_kept += 1
            stats.label_correct_kept += rec["first"] == rec["gold"]
