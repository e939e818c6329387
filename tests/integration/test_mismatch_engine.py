"""A deliberately wrong engine is flagged by the mismatch metrics, and the rollout correction reweights it.

The perturbed engine is ``bench/mismatch.py``'s ``TemperatureSkewEngine``: the real ``hf`` engine sampling
at 1.5 × the configured temperature and reporting that temperature's behaviour log-probs, registered in
the engine table for the test. The trainer recomputes at the configured temperature, so on the peaked
quickstart warm start the two disagree by a large, known-in-kind amount, while the clean engine agrees to
float rounding. Mechanism only: nothing here depends on what the runs learn.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.orchestration.runner import train
from tandem.rollout import registry

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/ratio_outside_frac")


@pytest.fixture
def skewed_backend(monkeypatch) -> str:
    """Register the bench's perturbed engine as a backend for this test; returns its name."""
    spec = importlib.util.spec_from_file_location("bench_mismatch", ROOT / "bench" / "mismatch.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_mismatch", module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(registry.ENGINES, module.SKEWED, "bench_mismatch:TemperatureSkewEngine")
    return module.SKEWED


def _run(tmp_path: Path, backend: str, mode: str = "colocated", **trainer) -> list[dict]:
    torch.set_num_threads(1)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / f"{backend}-{mode}"), "seed": 3},
            "model": {"path": str(ROOT / "checkpoints" / "quickstart-warmstart")},
            "data": {
                "task": "arith",
                "task_options": {"digits": 2, "ops": "+"},
                "prompts_per_step": 4,
                "eval_size": 0,
                "train_size": 64,
            },
            "rollout": {"n": 4, "max_new_tokens": 6, "temperature": 1.0, "backend": backend},
            "algorithm": {"name": "grpo", "correction": "token_tis"},
            "trainer": {"total_steps": 3, "lr": 6e-4, **trainer},
            "architecture": {
                "mode": mode,
                **({"staleness": 0, "num_workers": 1} if mode == "decoupled" else {}),
            },
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
            "checkpoint": {"save_final": False},
        }
    )
    rows = step_rows(train(cfg, progress=False).run_dir)
    assert len(rows) == 3 and all(k in r for r in rows for k in KEYS)  # logged every step
    return rows


def _assert_clean(rows: list[dict]) -> None:
    for r in rows:
        assert r["rollout/logprob_diff_mean"] < 1e-5 and r["rollout/logprob_diff_max"] < 1e-4, r
        assert r["rollout/ratio_outside_frac"] == 0.0
        assert r["actor/correction_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # nothing to correct
        assert r["actor/correction_weight_min"] == pytest.approx(1.0, abs=1e-3)


def test_perturbed_engine_is_flagged_and_the_correction_reweights(tmp_path, skewed_backend):
    clean = _run(tmp_path, "hf")
    _assert_clean(clean)
    skewed = _run(tmp_path, skewed_backend)
    for c, s in zip(clean, skewed, strict=True):
        assert s["rollout/logprob_diff_mean"] > 0.05
        assert s["rollout/logprob_diff_mean"] > 1000 * max(c["rollout/logprob_diff_mean"], 1e-8)
        assert s["rollout/logprob_diff_max"] > 0.3
    assert sum(r["rollout/ratio_outside_frac"] for r in skewed) > 0
    # token_tis weights min(rho, 2): tokens the hot sampler over-sampled (rho << 1) are down-weighted and
    # the likely tokens it under-sampled (rho > 1) up-weighted. (The mean weight stays near 1 by
    # construction, E_mu[rho] = 1, so the spread is what shows the correction acting.)
    assert min(r["actor/correction_weight_min"] for r in skewed) < 0.5
    assert max(r["actor/correction_weight_max"] for r in skewed) > 1.05


def test_decoupled_learner_logs_the_mismatch_from_recomputed_old_logprobs(tmp_path):
    # two epochs: the old log-probs are recomputed (make_experience), which is where the metric comes from
    _assert_clean(_run(tmp_path, "hf", mode="decoupled", ppo_epochs=2))
