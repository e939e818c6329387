"""Judges for paired comparisons: who answered a prompt better, A or B?

``compare(prompts, answers_a, answers_b, columns)`` returns one outcome per prompt from B's point of view
(+1 B better, 0 tie, −1 A better). Specs on the command line:

- ``verifier`` — the task's verifier (or the eval file's reward function) scores each answer.
- ``reward-model:PATH`` — a Hugging Face sequence-classification reward model (one logit) scores
  ``prompt + answer``; higher wins.
- ``llm:PATH`` — a local causal LM reads both answers and we compare the probability it gives to
  "A" and "B" after the question "Which answer is better?". It sees both orders; an outcome counts only
  when both orders agree, so position bias becomes a tie instead of a win.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from tandem.errors import ConfigError, ModelError
from tandem.rewards import RewardSet

Columns = Mapping[str, Sequence[Any]]
_TIE_TOL = 1e-6

LLM_TEMPLATE = (
    "Question: {prompt}\nAnswer A: {first}\nAnswer B: {second}\nWhich answer is better, A or B?\nBetter:"
)


class Judge(Protocol):
    name: str

    def compare(
        self, prompts: list[str], answers_a: list[str], answers_b: list[str], columns: Columns
    ) -> list[int]:
        """One outcome per prompt: +1 B better, 0 tie, −1 A better."""
        ...


def sign_outcomes(score_a: torch.Tensor, score_b: torch.Tensor) -> list[int]:
    """+1 where B scores higher, −1 where A does, 0 within a tolerance. ``[N]``, ``[N]`` -> N ints."""
    diff = score_b.float() - score_a.float()
    return [0 if abs(d) <= _TIE_TOL else (1 if d > 0 else -1) for d in diff.tolist()]


class VerifierJudge:
    """Scores each answer with the task verifier (or reward functions); the higher score wins."""

    name = "verifier"

    def __init__(self, rewards: RewardSet) -> None:
        self.rewards = rewards

    def compare(
        self, prompts: list[str], answers_a: list[str], answers_b: list[str], columns: Columns
    ) -> list[int]:
        sa = self.rewards(prompts, answers_a, columns).scores
        sb = self.rewards(prompts, answers_b, columns).scores
        return sign_outcomes(sa, sb)


def _require_local_model(path: str) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelError("not a Hugging Face model folder (no config.json)", where=str(p))
    if not any(p.glob("*.safetensors")):
        raise ModelError("no safetensors weights (pickle checkpoints are refused)", where=str(p))
    return p


def _refuse_a_policy(path: Path) -> None:
    """A causal LM (a policy: what ``tandem train``/``dpo`` write) given as a reward model would load with
    a fresh, random scoring head; say what it is instead of "this one has 2 outputs"."""
    import json

    try:
        archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        return
    if archs and all(str(a).endswith("ForCausalLM") for a in archs):
        raise ModelError(
            f"is a language model ({archs[0]}), not a reward model",
            where=str(path),
            hint="a reward model is a sequence classifier with one output, e.g. what tandem rm writes; "
            "to judge with a language model use --judge llm:PATH",
        )


class RewardModelJudge:
    """A sequence-classification reward model scores ``prompt + answer``; the higher reward wins."""

    name = "reward-model"

    def __init__(self, path: str, *, batch_size: int = 32) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from tandem.models.encoder import reward_model_kind

        p = _require_local_model(path)
        _refuse_a_policy(p)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            p, use_safetensors=True, local_files_only=True
        )
        if self.model.config.num_labels != 1:
            raise ModelError(
                f"a reward model has one output, this one has {self.model.config.num_labels}", where=str(p)
            )
        self.encoder = reward_model_kind(self.model.config, where=str(p)) == "encoder"
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, prompts: list[str], answers: list[str]) -> torch.Tensor:
        """Reward of every (prompt, answer) pair: ``[N]`` float32. An encoder RM (BERT, RoBERTa) scores
        the pair as ``tandem rm`` trained it: ``tokenizer(prompt, answer)``, right padded."""
        from tandem.models.encoder import encoder_scores

        out = []
        for i in range(0, len(prompts), self.batch_size):
            if self.encoder:
                ps, answers_i = prompts[i : i + self.batch_size], answers[i : i + self.batch_size]
                out.append(encoder_scores(self.model, self.tokenizer, ps, answers_i))
                continue
            texts = [
                p + a
                for p, a in zip(
                    prompts[i : i + self.batch_size], answers[i : i + self.batch_size], strict=True
                )
            ]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True)
            out.append(self.model(**enc).logits[:, 0].float())  # [b]
        return torch.cat(out) if out else torch.zeros(0)

    def compare(
        self, prompts: list[str], answers_a: list[str], answers_b: list[str], columns: Columns
    ) -> list[int]:
        return sign_outcomes(self.score(prompts, answers_a), self.score(prompts, answers_b))


class LLMJudge:
    """A local causal LM as a pairwise judge, asked in both orders (see the module docstring)."""

    name = "llm"

    def __init__(self, path: str, *, template: str = LLM_TEMPLATE, batch_size: int = 16) -> None:
        from tandem.models import load_model, load_tokenizer

        p = _require_local_model(path)
        self.model = load_model(p)
        self.model.eval()
        self.tokenizer = load_tokenizer(p)
        self.template = template
        self.batch_size = batch_size
        self.choice_ids = [self._token_id(" A", "A"), self._token_id(" B", "B")]

    def _token_id(self, *texts: str) -> int:
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) == 1:
                return ids[0]
        ids = self.tokenizer(texts[-1], add_special_tokens=False)["input_ids"]
        if not ids:
            raise ModelError(f"the judge's tokenizer cannot encode {texts[-1]!r}", where="--judge llm:")
        return ids[0]

    @torch.no_grad()
    def prefers_second(self, prompts: list[str], first: list[str], second: list[str]) -> torch.Tensor:
        """log P("B") − log P("A") at the end of the judging prompt: ``[N]``; > 0 means "second is better"."""
        out = []
        for i in range(0, len(prompts), self.batch_size):
            rows = range(i, min(i + self.batch_size, len(prompts)))
            texts = [self.template.format(prompt=prompts[j], first=first[j], second=second[j]) for j in rows]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True)
            pos = (enc["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)  # [b, T] left padding safe
            logits = self.model(**enc, position_ids=pos).logits[:, -1].float()  # [b, V] next token
            lp = torch.log_softmax(logits, dim=-1)[:, self.choice_ids]  # [b, 2] (A, B)
            out.append(lp[:, 1] - lp[:, 0])
        return torch.cat(out) if out else torch.zeros(0)

    def compare(
        self, prompts: list[str], answers_a: list[str], answers_b: list[str], columns: Columns
    ) -> list[int]:
        ab = self.prefers_second(prompts, answers_a, answers_b)  # > 0: B (shown second) better
        ba = self.prefers_second(prompts, answers_b, answers_a)  # > 0: A (shown second) better
        return combine_orders(ab, ba)


def combine_orders(b_second: torch.Tensor, a_second: torch.Tensor) -> list[int]:
    """Outcome from the two presentation orders: B wins only if preferred in both, A likewise; else tie.
    ``b_second[i] > 0``: judge preferred B shown second; ``a_second[i] > 0``: preferred A shown second."""
    out = []
    for x, y in zip(b_second.tolist(), a_second.tolist(), strict=True):
        out.append(1 if x > 0 and y < 0 else (-1 if x < 0 and y > 0 else 0))
    return out


def check_judge_spec(spec: str) -> tuple[str, str]:
    """Split and validate ``verifier`` | ``reward-model:PATH`` | ``llm:PATH`` before any model is loaded."""
    kind, _, arg = spec.partition(":")
    if (kind == "verifier" and not arg) or (kind in ("reward-model", "llm") and arg):
        return kind, arg
    raise ConfigError(
        f"unknown judge {spec!r}", where="--judge", hint="use verifier, reward-model:PATH or llm:PATH"
    )


def build_judge(spec: str, verifier: RewardSet | None) -> Judge:
    """``verifier`` | ``reward-model:PATH`` | ``llm:PATH`` -> a judge; ConfigError names ``--judge``."""
    kind, arg = check_judge_spec(spec)
    if kind == "verifier":
        if verifier is None:
            raise ConfigError("the verifier judge needs a task or a reward function", where="--judge")
        return VerifierJudge(verifier)
    if kind == "reward-model":
        return RewardModelJudge(arg)
    return LLMJudge(arg)
