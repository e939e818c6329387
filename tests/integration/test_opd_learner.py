"""On-policy distillation (``algorithm.name: opd``) through the real learner: the teacher scores the
student's samples in both architectures (decoupled with η = 0 reproduces colocated exactly, teacher
included), the advantages are the teacher-minus-student log-probs of the sampled tokens, and a teacher
with another tokenizer is refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.errors import ConfigError
from tandem.models import init_tiny_model, load_causal_lm
from tandem.orchestration.decoupled.runtime import train_decoupled
from tandem.orchestration.parts import build_parts
from tandem.orchestration.runner import train
from tandem.rollout.base import SamplingParams
from tandem.train.checkpoint import latest_checkpoint
from tandem.train.experience import ExperienceSettings, make_experience, scoring_logprobs


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another tiny Llama (wider, other seed) with the same character tokenizer as ``tiny_model_dir``."""
    out = tmp_path_factory.mktemp("teacher") / "teacher"
    return init_tiny_model(out, hidden_size=48, num_layers=2, num_heads=2, seed=7)


def _cfg(student, teacher, out, mode="colocated", **algo):
    arch = {"staleness": 0, "num_workers": 1} if mode == "decoupled" else {}
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 3},
            "model": {"path": str(student)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 2, "max_new_tokens": 4},
            "algorithm": {"name": "opd", "opd": {"teacher": str(teacher), **algo}},
            "trainer": {"total_steps": 2, "lr": 3e-3},
            "architecture": {"mode": mode, **arch},
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def test_opd_runs_colocated_and_decoupled_alike(tiny_model_dir, teacher_dir, tmp_path):
    torch.set_num_threads(1)
    colo = train(_cfg(tiny_model_dir, teacher_dir, tmp_path / "colo"), progress=False)
    dec = train_decoupled(_cfg(tiny_model_dir, teacher_dir, tmp_path / "dec", "decoupled"), progress=False)
    a, b = step_rows(colo.run_dir), step_rows(dec.run_dir)
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b, strict=True):
        assert ra["distill/reverse_kl"] == rb["distill/reverse_kl"]
        assert ra["actor/pg_loss"] == rb["actor/pg_loss"]
    assert a[0]["distill/reverse_kl"] != 0.0  # a random teacher disagrees with the student
    wa = load_causal_lm(latest_checkpoint(colo.run_dir / "checkpoints") / "model").state_dict()
    wb = load_causal_lm(latest_checkpoint(dec.run_dir / "checkpoints") / "model").state_dict()
    w0 = load_causal_lm(tiny_model_dir).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(w0[k], wa[k]) for k in w0)


def test_advantages_are_teacher_minus_student_logprobs(tiny_model_dir, teacher_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, teacher_dir, tmp_path / "run", reward_weight=0.5)
    parts = build_parts(cfg)
    prompts = [p for p in parts.data.train.prompts[:2] if isinstance(p, str)]
    batch = parts.engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, n=2))
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0])
    s = ExperienceSettings.from_config(
        cfg.algorithm, temperature=1.0, autocast_bf16=False, micro_batch_size=None
    )
    exp, metrics = make_experience(batch, scores, s, teacher=parts.teacher)
    mask = batch.response_mask
    teacher_lp = scoring_logprobs(parts.teacher, batch, s)
    centred = 0.5 * (scores - torch.tensor([0.5, 0.5, 0.0, 0.0])).unsqueeze(-1)
    expected = torch.where(mask, teacher_lp - batch.behavior_logprobs + centred, torch.zeros_like(teacher_lp))
    torch.testing.assert_close(exp.advantages, expected)
    gap = ((batch.behavior_logprobs - teacher_lp) * mask).sum() / mask.sum()
    assert metrics["distill/reverse_kl"] == pytest.approx(float(gap))


def test_a_teacher_with_another_tokenizer_is_one_config_error(tiny_model_dir, tmp_path):
    other = init_tiny_model(
        tmp_path / "other", hidden_size=32, num_layers=1, num_heads=2, chars="0123456789+= "
    )
    with pytest.raises(ConfigError, match=r"^algorithm.opd.teacher: the teacher's tokenizer differs") as info:
        build_parts(_cfg(tiny_model_dir, other, tmp_path / "run"))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()
