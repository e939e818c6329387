"""The on-policy distillation estimator (``opd``): hand-computed per-token advantages."""

from __future__ import annotations

import pytest
import torch

from tandem.algos import ADVANTAGE_ESTIMATORS, compute_advantages

MASK = torch.tensor([[True, True, False], [True, True, True]])  # [2, 3]
STUDENT = torch.tensor([[-1.0, -0.5, 7.0], [-2.0, -0.1, -3.0]])  # [2, 3], 7.0 is padding
TEACHER = torch.tensor([[-0.5, -2.5, float("nan")], [-2.0, -0.6, -1.0]])  # NaN in the padding


def _opd(**kw):
    kw.setdefault("scores", torch.tensor([1.0, 0.0]))
    kw.setdefault("group_ids", torch.tensor([0, 0]))
    kw.setdefault("norm_by_std", False)
    return compute_advantages("opd", response_mask=MASK, logprobs=STUDENT, teacher_logprobs=TEACHER, **kw)


def test_advantage_is_teacher_minus_student_per_token():
    adv, ret = _opd()
    # log pi_teacher - log pi_student: (-0.5+1, -2.5+0.5) and (-2+2, -0.6+0.1, -1+3)
    expected = torch.tensor([[0.5, -2.0, 0.0], [0.0, -0.5, 2.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    assert not adv.isnan().any()  # NaN in the teacher's padding never leaks


def test_reward_weight_adds_the_group_centred_reward_to_every_token():
    adv, _ = _opd(reward_weight=0.5)
    # group mean 0.5: +0.5 * (1 - 0.5) = +0.25 on row 0, +0.5 * (0 - 0.5) = -0.25 on row 1, valid tokens only
    expected = torch.tensor([[0.75, -1.75, 0.0], [-0.25, -0.75, 1.75]])
    torch.testing.assert_close(adv, expected)


def test_a_reward_alone_in_its_group_adds_nothing():
    adv, _ = _opd(reward_weight=2.0, group_ids=torch.tensor([0, 1]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, -2.0, 0.0], [0.0, -0.5, 2.0]]))


def test_identical_teacher_gives_zero_advantage_and_ignores_gamma():
    adv, _ = compute_advantages(
        "opd",
        scores=torch.zeros(2),
        response_mask=MASK,
        group_ids=torch.tensor([0, 1]),
        logprobs=STUDENT,
        teacher_logprobs=STUDENT.clone(),
        gamma=0.5,
        lam=0.3,
    )
    assert torch.equal(adv, torch.zeros_like(adv))


def test_registry_entry_names_its_inputs():
    spec = ADVANTAGE_ESTIMATORS.get("opd")
    assert spec.requires == ("logprobs", "teacher_logprobs")
    assert not spec.group_relative and not spec.needs_critic


@pytest.mark.parametrize("missing", ["logprobs", "teacher_logprobs"])
def test_missing_input_is_named(missing):
    kw = {"logprobs": STUDENT, "teacher_logprobs": TEACHER, missing: None}
    with pytest.raises(ValueError, match=f"needs {missing}="):
        compute_advantages(
            "opd", scores=torch.zeros(2), response_mask=MASK, group_ids=torch.tensor([0, 1]), **kw
        )


def test_wrong_shape_is_named():
    with pytest.raises(ValueError, match="teacher_logprobs must have shape"):
        compute_advantages(
            "opd",
            scores=torch.zeros(2),
            response_mask=MASK,
            group_ids=torch.tensor([0, 1]),
            logprobs=STUDENT,
            teacher_logprobs=TEACHER[:, :2],
        )


# ---------------------------------------------------------------- config rules


def _cfg(algorithm: dict, n: int = 4):
    from tandem.config import build_config

    return build_config(
        {
            "model": {"path": "unused"},
            "data": {"task": "arith", "prompts_per_step": 2},
            "rollout": {"n": n},
            "algorithm": algorithm,
        }
    )


def test_opd_preset_and_its_teacher():
    a = _cfg({"name": "opd", "opd": {"teacher": "models/t"}}).algorithm
    assert (a.advantage, a.policy_loss, a.aggregation, a.norm_by_std) == (
        "opd",
        "ppo_clip",
        "token-mean",
        False,
    )
    assert a.opd.teacher == "models/t" and a.opd.reward_weight == 0.0


@pytest.mark.parametrize(
    ("algorithm", "n", "message"),
    [
        ({"name": "opd"}, 4, r"algorithm.opd.teacher: advantage 'opd' distils from a teacher"),
        (
            {"name": "grpo", "opd": {"teacher": "t"}},
            4,
            r"algorithm.opd.teacher: advantage 'grpo' does not use",
        ),
        (
            {"name": "opd", "opd": {"teacher": "t", "reward_weight": 0.5}},
            1,
            r"algorithm.opd.reward_weight: the task-reward term is centred on the group mean",
        ),
        ({"name": "opd", "opd": {"teacher": "t", "reward_weight": -1}}, 4, r"algorithm.opd.reward_weight"),
    ],
)
def test_config_errors_name_the_key(algorithm, n, message):
    from tandem.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as info:
        _cfg(algorithm, n)
    assert "\n" not in str(info.value)


def test_opd_with_one_sample_per_prompt_and_no_reward_weight_is_fine():
    assert _cfg({"name": "opd", "opd": {"teacher": "t"}}, n=1).rollout.n == 1


def test_a_missing_teacher_folder_is_one_config_error(tmp_path):
    from tandem.errors import ConfigError
    from tandem.orchestration.build import build_teacher

    cfg = _cfg({"name": "opd", "opd": {"teacher": str(tmp_path / "nope")}})
    with pytest.raises(ConfigError, match=r"^algorithm.opd.teacher: no teacher model folder at .*nope"):
        build_teacher(cfg, tokenizer=None)


def test_vocab_mismatch_names_the_first_difference():
    from tandem.models import build_char_tokenizer
    from tandem.models.vocab import vocab_mismatch

    a, b = build_char_tokenizer("0123"), build_char_tokenizer("0123")
    assert vocab_mismatch(a, b) is None
    assert vocab_mismatch(a, build_char_tokenizer("01234")) == "vocabularies of 8 and 9 tokens"
    assert (
        vocab_mismatch(a, build_char_tokenizer("1023"))
        == "token '0' is id 4 for the student, 5 for the teacher"
    )
