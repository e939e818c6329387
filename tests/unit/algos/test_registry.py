from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import tandem.algos as A
from tandem.algos.registry import DuplicateNameError, Registry, UnknownNameError


def test_unregister_removes_and_returns_the_entry() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    assert reg.unregister("a") == 1 and "a" not in reg
    reg.add("a", 2)  # the name is free again
    with pytest.raises(UnknownNameError, match="unknown thing 'b'; valid names: a"):
        reg.unregister("b")


def test_duplicate_registration_raises() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(DuplicateNameError, match="'a' is already registered"):
        reg.add("a", 2)
    assert reg.get("a") == 1


def test_unknown_name_lists_valid_names() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("alpha", 1)
    reg.register("beta")(2)
    with pytest.raises(UnknownNameError) as err:
        reg.get("gamma")
    assert str(err.value) == "unknown thing 'gamma'; valid names: alpha, beta"
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert reg.names() == ["alpha", "beta"] and "alpha" in reg and len(reg) == 2


def test_empty_name_rejected() -> None:
    with pytest.raises(ValueError):
        Registry[int]("thing").add("", 1)


@pytest.mark.parametrize(
    ("registry", "expected"),
    [
        (
            A.ADVANTAGE_ESTIMATORS,
            {
                "gae",
                "grpo",
                "passk",
                "dr_grpo",
                "rloo",
                "reinforce_pp",
                "reinforce_pp_baseline",
                "remax",
                "opd",
            },
        ),
        (A.POLICY_LOSSES, {"ppo_clip", "decoupled_ppo", "gspo", "cispo", "topr", "agro"}),
        (A.KL_ESTIMATORS, {"k1", "k2", "k3", "low_var_kl", "abs", "k3+"}),
        (
            A.AGGREGATIONS,
            {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"},
        ),
        (A.PREFERENCE_LOSSES, {"sigmoid", "ipo", "hinge", "robust"}),
        (A.CORRECTIONS, {"token_tis", "seq_tis", "token_mis", "seq_mis", "token_rs", "seq_rs"}),
    ],
)
def test_registered_names(registry: Registry, expected: set[str]) -> None:
    assert set(registry.names()) == expected


def test_builtin_registries_reject_duplicates() -> None:
    with pytest.raises(DuplicateNameError):
        A.POLICY_LOSSES.add("ppo_clip", A.POLICY_LOSSES.get("ppo_clip"))


def test_every_registered_name_is_documented() -> None:
    doc = Path(__file__).resolve().parents[3] / "docs" / "algorithms.md"
    text = doc.read_text()
    regs = [A.ADVANTAGE_ESTIMATORS, A.POLICY_LOSSES, A.KL_ESTIMATORS, A.AGGREGATIONS, A.PREFERENCE_LOSSES]
    missing = [n for reg in [*regs, A.CORRECTIONS] for n in reg.names() if f"`{n}`" not in text]
    assert not missing, f"docs/algorithms.md lacks entries for {missing}"


def test_algos_imports_only_torch_and_stdlib() -> None:
    """Static check of every import statement under tandem/algos (including lazy ones in functions)."""
    pkg = Path(A.__file__).parent
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top not in allowed and not mod.startswith("tandem.algos"):
                    bad.append(f"{path.name}: {mod}")
    assert not bad, bad


def test_public_api_exports() -> None:
    assert set(A.__all__) >= {
        "compute_advantages",
        "policy_loss",
        "aggregate",
        "kl_penalty",
        "FixedKL",
        "AdaptiveKL",
        "dpo_loss",
        "reward_model_loss",
        "value_loss",
        "explained_variance",
        "selective_log_softmax",
        "entropy_from_logits",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "filter_groups",
        "overlong_penalty",
    }
    assert all(hasattr(A, name) for name in A.__all__)
