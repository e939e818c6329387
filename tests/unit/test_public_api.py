"""Pins the public API: what ``tandem`` and ``tandem.algos`` export. Changing it must be deliberate."""

from __future__ import annotations

import importlib
import subprocess
import sys

import tandem
import tandem.algos


def test_top_level_exports():
    assert sorted(tandem.__all__) == ["TandemError", "__version__", "load_config", "run_training"]
    importlib.import_module("tandem.train")  # the subpackage must not shadow the function (it once did)
    assert callable(tandem.load_config) and callable(tandem.run_training)


def test_import_tandem_is_light():
    code = "import sys, tandem; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_algos_exports():
    expected = {
        "ADVANTAGE_ESTIMATORS",
        "AGGREGATIONS",
        "KL_ESTIMATORS",
        "POLICY_LOSSES",
        "PREFERENCE_LOSSES",
        "CORRECTIONS",
        "compute_advantages",
        "policy_loss",
        "aggregate",
        "kl_penalty",
        "FixedKL",
        "AdaptiveKL",
        "selective_log_softmax",
        "entropy_from_logits",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "filter_groups",
        "overlong_penalty",
        "dpo_loss",
        "reward_model_loss",
        "value_loss",
        "explained_variance",
        "topk_forward_kl",
    }
    assert expected <= set(tandem.algos.__all__)
    assert tandem.algos.ADVANTAGE_ESTIMATORS.names() == [
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "remax",
        "opd",
        "passk",
    ]
    assert tandem.algos.POLICY_LOSSES.names() == [
        "ppo_clip",
        "decoupled_ppo",
        "gspo",
        "cispo",
        "topr",
        "agro",
    ]


def test_layer_contracts_hold():
    """The import-linter contracts in pyproject.toml (also run by `make lint`)."""
    import pathlib
    import shutil

    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([exe], capture_output=True, text=True, cwd=pathlib.Path(__file__).parents[2])
    assert out.returncode == 0, out.stdout[-2000:]
