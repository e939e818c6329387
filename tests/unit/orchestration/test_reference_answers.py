"""``rollout.reference_answers``: the prompt file's answer joins each group no sample solved. Real tiny
runs (the reference row is the file's answer, tokenised as a sample, scored by the reward and by the
engine as the learner scores it), the selection rule on hand-built groups, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rollout_batches import constant_batch

from tandem.algos import reference_nll
from tandem.channels.base import TrajectoryMessage
from tandem.channels.serialize import decode_message, encode_message
from tandem.config import build_config
from tandem.errors import ConfigError, DataError
from tandem.monitor import read_metrics
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.parts import build_parts
from tandem.orchestration.reference_answers import (
    ReferenceSettings,
    add_references,
    check_reference_engine,
    reference_text,
)
from tandem.orchestration.runner import train
from tandem.train.experience import make_experience
from tandem.types import concat_rollouts

DIGITS = f"{Path(__file__).parents[2] / 'e2e' / 'digits_reward.py'}:digit_share"


def _data(model_dir, out, steps=2, **rollout):
    return {
        "run": {"output_dir": str(out), "seed": 5},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 3, "eval_size": 0, "train_size": 32},
        "rollout": {"n": 3, "max_new_tokens": 6, "reference_answers": {"column": "answer"}, **rollout},
        "algorithm": {"name": "grpo"},
        "trainer": {"total_steps": steps, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
    }


def test_reference_text_ends_with_eos_or_the_templates_stop_string():
    ref = reference_text("{}", 42, ["\n"])
    assert (ref.tokens_text, ref.completion, ref.add_eos) == ("42", "42", True)
    ref = reference_text("{}\n", 42, ["\n"])  # a template that ends as the sampler would stop
    assert (ref.tokens_text, ref.completion, ref.add_eos) == ("42\n", "42", False)
    ref = reference_text("x={}\ny", 7, ["\n", "="])  # cut after the first stop string in the text
    assert (ref.tokens_text, ref.completion, ref.add_eos) == ("x=", "x", False)
    ref = reference_text("The answer is {}.", 3, [])
    assert (ref.tokens_text, ref.completion, ref.add_eos) == ("The answer is 3.", "The answer is 3.", True)


def test_all_fail_groups_get_the_files_answer_scored_by_the_engine(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    trainer = ColocatedTrainer(build_parts(build_config(_data(tiny_model_dir, tmp_path))))
    batch, scores, metrics = trainer.collect()
    ref = batch.reference
    assert ref is not None and int(ref.sum()) >= 1, "an untrained model should fail some group entirely"
    engine, tok = trainer.parts.engine, trainer.parts.tokenizer
    for i in ref.nonzero().squeeze(1).tolist():
        group = batch.group_ids == batch.group_ids[i]
        samples = group & ~ref
        assert int(samples.sum()) == 3 and float(scores[samples].max()) == 0.0  # its group: all failed
        assert i == int(group.nonzero().max())  # the reference is its group's last row
        answer = batch.extras[i]["answer"]
        assert batch.completions[i] == str(answer) and float(scores[i]) == 1.0  # the task reward's verdict
        n = int(batch.response_mask[i].sum())
        want_ids = tok(str(answer), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert batch.response_ids[i, :n].tolist() == want_ids
        first = int(group.nonzero().min())
        assert torch.equal(batch.prompt_ids[i], batch.prompt_ids[first])
        want = engine.score(batch.prompt_ids[i : i + 1], batch.prompt_mask[i : i + 1],
                            batch.response_ids[i : i + 1], batch.response_mask[i : i + 1])  # fmt: skip
        assert torch.allclose(batch.behavior_logprobs[i : i + 1], want)
    # a group where a sample succeeded gets none
    solved = [
        g for g in set(batch.group_ids.tolist()) if float(scores[(batch.group_ids == g) & ~ref].max()) > 0
    ]
    assert not any(bool(ref[batch.group_ids == g].any()) for g in solved)
    groups = len(set(batch.group_ids.tolist()))
    assert metrics["reference/added_frac"] == pytest.approx(int(ref.sum()) / groups)


def test_a_run_learns_from_the_reference_rows_as_from_samples(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    result = train(build_config(_data(tiny_model_dir, tmp_path / "run")), progress=False)
    rows = [r for r in read_metrics(result.run_dir) if r["step"] >= 1]
    assert len(rows) == 2 and all(r["reference/added_frac"] > 0 for r in rows)
    # the engine's teacher-forced log-probs of the reference rows are the learner's: a misaligned row or
    # another temperature would differ by far more than 1e-3
    assert max(r["rollout/logprob_diff_max"] for r in rows) < 1e-3


class _Scorer:
    """A fake engine for the selection rule: tokenises one token per character, log-prob -0.5 each."""

    version = 4

    class tokenizer:  # noqa: N801 — the attribute an engine exposes
        eos_token_id = 9

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) % 50 for c in text]}

    tokenizer = tokenizer()

    def score(self, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature=1.0):
        self.temperature = temperature
        return torch.full(response_ids.shape, -0.5) * response_mask


def test_only_groups_whose_reference_beats_their_shared_score_get_one():
    # groups: 10 all-fail, 11 mixed, 12 all-pass (the reference ties: left out), 13 all-fail, too long
    extras = [{"answer": "7"}] * 9 + [{"answer": "123456"}] * 2
    batch = constant_batch([10, 10, 11, 11, 11, 12, 12, 12, 12, 13, 13], extras=extras)
    scores = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    s = ReferenceSettings("answer", "{}", ["\n"], max_new_tokens=4, pad_token_id=0)
    seen = []

    def score(rows):
        seen.append(rows.completions)
        return torch.ones(rows.batch_size)

    engine = _Scorer()
    out, out_scores, m = add_references((batch, scores), engine, s, score, 0.7)
    assert seen == [["7", "7"]]  # groups 10 and 12 scored; 13's "123456" + EOS exceeds 4 tokens
    assert out.group_ids.tolist() == [10, 10, 10, 11, 11, 11, 12, 12, 12, 12, 13, 13]
    assert out.reference.tolist() == [False, False, True] + [False] * 9
    assert out_scores.tolist()[:3] == [0.0, 0.0, 1.0] and engine.temperature == 0.7
    assert out.response_ids[2].tolist() == [ord("7") % 50, 9]  # its token and EOS
    assert out.policy_version.tolist()[2] == 4 and out.behavior_logprobs[2].tolist() == [-0.5, -0.5]
    assert m == {"reference/added_frac": 0.25, "reference/not_better_frac": 0.5, "reference/too_long": 1.0}
    same, _, m = add_references((batch.select([2, 3]), scores[2:4]), engine, s, score, 1.0)
    assert same.batch_size == 2 and m["reference/added_frac"] == 0.0  # no all-equal group: nothing added


def test_the_reference_flag_survives_select_concat_and_the_wire():
    b = constant_batch([0, 0], reference=torch.tensor([False, True]))
    joined = concat_rollouts([b, constant_batch([1])], pad_token_id=0)
    assert joined.reference.tolist() == [False, True, False] and joined.greedy is None
    assert joined.select([1, 2]).reference.tolist() == [True, False]
    msg = TrajectoryMessage(joined, torch.zeros(3), ticket=0, worker_id=0, meta={})
    assert decode_message(encode_message(msg)).batch.reference.tolist() == [False, True, False]


def test_bad_setups_name_the_key_or_the_row(tiny_model_dir, tmp_path):
    data = _data(tiny_model_dir, tmp_path)
    with pytest.raises(ConfigError, match=r"rollout\.reference_answers\.column.*dynamic_sampling"):
        build_config({**data, "algorithm": {"name": "dapo"}})
    with pytest.raises(ConfigError, match=r"rollout\.reference_answers\.column.*single-turn"):
        build_config({**data, "env": {"name": "calculator"}})
    rows = [{"prompt": f"1+{i}=", "answer": str(1 + i)} for i in range(6)]
    rows[4] = {"prompt": "1+4="}
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data["data"] = {"train_file": str(path), "prompts_per_step": 2, "eval_size": 0}
    data["reward"] = {"task_reward": False, "functions": [{"path": DIGITS}]}
    data["run"]["output_dir"] = str(tmp_path / "refused")
    with pytest.raises(DataError, match=r"train\.jsonl:5.*'answer'"):
        train(build_config(data), progress=False)
    assert not (tmp_path / "refused").exists()  # refused in the pre-flight: no run folder written
    with pytest.raises(ConfigError, match=r"rollout\.backend.*scores given completions"):
        check_reference_engine(object())


def test_reference_nll_is_the_mean_over_the_reference_tokens():
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5], [-3.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    ref = torch.tensor([True, False, True])
    loss = reference_nll(lp, mask, ref, global_tokens=3)  # rows 0 and 2: 3 tokens, -(-1 - 2 - 3) / 3
    assert float(loss.detach()) == pytest.approx(2.0)
    loss.backward()
    want = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]) / 3
    assert torch.allclose(lp.grad, want)
    assert float(reference_nll(lp, mask, torch.zeros(3, dtype=torch.bool), 0).detach()) == 0.0


def test_imitate_keeps_the_groups_advantages_at_zero_and_trains_the_reference(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    data = _data(tiny_model_dir, tmp_path)
    data["rollout"]["reference_answers"] |= {"mode": "imitate", "coef": 0.5}
    data["trainer"]["lr"] = 1e-4
    trainer = ColocatedTrainer(build_parts(build_config(data)))
    batch, scores, _ = trainer.collect()
    assert batch.reference is not None and bool(batch.reference.any()), "fixture: no all-fail group"
    # only the groups that got a reference: zero advantages everywhere, so the NLL is the whole gradient
    in_ref_group = torch.isin(batch.group_ids, batch.group_ids[batch.reference])
    sub, sub_scores = batch.select(in_ref_group.nonzero().squeeze(1)), scores[in_ref_group]
    assert float(sub_scores.abs().sum()) == 0.0  # the reference carries its group's score, not its own 1
    exp, _ = make_experience(sub, sub_scores, trainer.learn.exp_settings)
    assert float(exp.advantages.abs().sum()) == 0.0
    ref = sub.select(sub.reference.nonzero().squeeze(1))
    engine = trainer.parts.engine  # colocated: the engine samples with the trained module

    def nll() -> float:
        lp = engine.score(ref.prompt_ids, ref.prompt_mask, ref.response_ids, ref.response_mask)
        return float(-(lp * ref.response_mask).sum() / ref.response_mask.sum())

    before = nll()
    metrics = trainer.learn(sub, sub_scores)
    assert metrics["actor/reference_nll"] == pytest.approx(before, rel=1e-4)  # its rows, its normaliser
    assert nll() < before  # one small step on the NLL alone lowers it
