"""RLAIF labelling: rule judge with injected noise (swap filter raises label accuracy), HTTP judge
against a local test server (parse failures, timeouts, HTTP 500 retried then OK, 4xx not retried),
HF judge, and resume after a crash without re-judging."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tandem.errors import DataError
from tandem.rewards.tasks.safety import SafetyTask, make_preference_rows
from tandem.train import labeling


def safety_rows(n: int):
    """Rows with response_a/response_b in random order and the gold verdict."""
    out = []
    for i, r in enumerate(make_preference_rows(SafetyTask(), "train", n, seed=0)):
        a, b, gold = (r["chosen"], r["rejected"], "a") if i % 2 else (r["rejected"], r["chosen"], "b")
        out.append(
            (
                f"rows.jsonl:{i + 1}",
                {
                    "prompt": r["prompt"],
                    "response_a": a,
                    "response_b": b,
                    "answer": r["answer"],
                    "gold": gold,
                },
            )
        )
    return out


def test_swap_filter_raises_label_accuracy_under_20_percent_noise(tmp_path):
    judge = labeling.RuleJudge(labeling.task_rule(SafetyTask()))
    stats = labeling.label_rows(safety_rows(400), judge, tmp_path / "out.jsonl", noise=0.2, seed=0)
    assert stats.rows == 400 and stats.gold_rows == 400
    assert 0.74 < stats.accuracy_single < 0.86  # ~ 1 - noise
    assert stats.accuracy_kept > 0.9 and stats.accuracy_kept > stats.accuracy_single + 0.08
    assert 0.6 < stats.agreement_rate < 0.76  # 0.8² + 0.2² = 0.68 expected
    kept = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(kept) == stats.kept and set(kept[0]) == {"prompt", "chosen", "rejected"}


def test_noise_free_rule_judge_is_exact(tmp_path):
    judge = labeling.RuleJudge(labeling.task_rule(SafetyTask()))
    stats = labeling.label_rows(safety_rows(50), judge, tmp_path / "out.jsonl")
    assert stats.kept == 50 and stats.accuracy_kept == 1.0 and stats.disagreements == 0


def test_resume_does_not_judge_rows_again(tmp_path):
    rows = safety_rows(20)
    calls = []
    base = labeling.RuleJudge(labeling.task_rule(SafetyTask()))

    def crashing(prompt, a, b, row):
        calls.append(prompt)
        if len(calls) == 21:  # crash in the middle of row 11
            raise KeyboardInterrupt
        return base(prompt, a, b, row)

    with pytest.raises(KeyboardInterrupt):
        labeling.label_rows(rows, crashing, tmp_path / "out.jsonl")
    progress = tmp_path / "out.jsonl.progress.jsonl"
    assert len(progress.read_text().splitlines()) == 10
    with progress.open("a") as fh:
        fh.write('{"id": "torn')  # a torn line from the crash is ignored
    calls.clear()
    stats = labeling.label_rows(rows, crashing, tmp_path / "out.jsonl")
    assert stats.resumed == 10 and stats.rows == 10 and len(calls) == 20 and stats.kept == 20


class _Judge(BaseHTTPRequestHandler):
    """Scripted OpenAI-compatible judge: replies are popped from server.script."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((body, self.headers.get("Authorization")))
        action = self.server.script.pop(0) if self.server.script else "A"
        if action == "sleep":
            time.sleep(2.0)  # beyond the client timeout below
            action = "A"
        if isinstance(action, int):
            self.send_response(action)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "boom"}}')
            return
        payload = {"choices": [{"message": {"role": "assistant", "content": action}}]}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    srv.script, srv.requests = [], []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def http_judge(server, **kw):
    sleeps = []
    judge = labeling.HTTPJudge(
        f"http://127.0.0.1:{server.server_port}/v1", "judge-model", api_key="k", sleep=sleeps.append, **kw
    )
    return judge, sleeps


def test_http_judge_parses_and_sends_key(server):
    judge, _ = http_judge(server)
    server.script = ["Response B.", "A"]
    assert judge("p", "x", "y", {}) == "b" and judge("p", "x", "y", {}) == "a"
    body, auth = server.requests[0]
    assert (
        auth == "Bearer k"
        and body["model"] == "judge-model"
        and "Response A: x" in body["messages"][0]["content"]
    )


def test_http_500_is_retried_with_backoff_then_succeeds(server):
    judge, sleeps = http_judge(server, max_retries=3, backoff_s=0.25)
    server.script = [500, 503, "B"]
    assert judge("p", "x", "y", {}) == "b"
    assert sleeps == [0.25, 0.5]


def test_http_failures_are_counted_not_fatal(server, tmp_path):
    judge, _ = http_judge(server, max_retries=1, timeout_s=1.0)  # generous: CI machines are busy
    rows = [(f"r:{i}", {"prompt": f"p{i}", "response_a": "x", "response_b": "y"}) for i in range(4)]
    server.script = [
        "I like both",  # row 0: unparseable
        500, 500,  # row 1: 500 twice -> gives up
        "sleep", "sleep",  # row 2: timeout twice
        "A", "B",  # row 3: A then (swapped) B -> consistent, a wins
    ]  # fmt: skip
    stats = labeling.label_rows(rows, judge, tmp_path / "o.jsonl")
    assert (stats.parse_failures, stats.timeouts, stats.kept) == (1, 2, 1)
    assert json.loads((tmp_path / "o.jsonl").read_text()) == {"prompt": "p3", "chosen": "x", "rejected": "y"}


def test_http_4xx_is_not_retried(server):
    judge, sleeps = http_judge(server, max_retries=3)
    server.script = [400]
    with pytest.raises(labeling.JudgeParseError, match="HTTP 400"):
        judge("p", "x", "y", {})
    assert sleeps == []


def test_parse_verdict_and_row_shapes():
    assert labeling.parse_verdict(" b ") == "b"
    for bad in ("", "A or B", "neither"):
        with pytest.raises(labeling.JudgeParseError):
            labeling.parse_verdict(bad)
    assert labeling.row_pair({"prompt": "p", "completions": ["x", "y"]}, "w") == ("p", "x", "y")
    with pytest.raises(DataError, match="w: a row needs"):
        labeling.row_pair({"prompt": "p"}, "w")


def test_an_empty_sampled_answer_is_skipped_and_counted_not_blamed_on_the_input(tmp_path):
    rows = [
        (f"in.jsonl:{i}", {"prompt": "p", "completions": pair})
        for i, pair in enumerate([["x", ""], ["x", "y"]])
    ]
    judged = []

    def judge(prompt, a, b, row):
        judged.append((a, b))
        return "a" if a == "x" else "b"  # prefers "x" in either order: swap-consistent

    stats = labeling.label_rows(rows, judge, tmp_path / "out.jsonl")
    assert (stats.rows, stats.empty, stats.kept) == (2, 1, 1)
    assert ("x", "") not in judged and ("", "x") not in judged  # the judge never sees the empty pair
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 1


def test_hf_judge_is_deterministic(tiny_model_dir):
    from tandem.models import load_causal_lm, load_tokenizer

    judge = labeling.HFJudge(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir))
    v = judge("2+2?", "4", "5", {})
    assert v in ("a", "b") and judge("2+2?", "4", "5", {}) == v
