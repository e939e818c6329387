"""End-to-end fixtures shared by the eval, alert and report tests."""

from __future__ import annotations

import pytest

REVERSE_TASK = {"min_len": 2, "max_len": 3}


@pytest.fixture
def crash_at_step(monkeypatch):
    """``crash_at_step(cfg, k)``: run training that dies (RuntimeError) when it is about to start step
    ``k + 1`` — after the step-``k`` checkpoint — as a killed run would; then training works normally."""
    from tandem.orchestration.colocated import ColocatedTrainer
    from tandem.orchestration.runner import train

    def run(cfg, k: int) -> None:
        original = ColocatedTrainer.train_step

        def crashing_step(self):
            if self.step == k:
                raise RuntimeError("simulated crash")
            return original(self)

        monkeypatch.setattr(ColocatedTrainer, "train_step", crashing_step)
        try:
            with pytest.raises(RuntimeError, match="simulated crash"):
                train(cfg, progress=False)
        finally:
            monkeypatch.setattr(ColocatedTrainer, "train_step", original)

    return run


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory):
    """A tiny Llama that answers the reverse task sometimes (non-trivial accuracy, varied lengths);
    built once per test worker."""
    import torch

    from tandem.train.sft import build_warm_start

    torch.set_num_threads(1)
    return build_warm_start(
        tmp_path_factory.mktemp("warm") / "rev",
        task="reverse",
        task_options=REVERSE_TASK,
        steps=150,
        lr=1e-2,
        batch_size=32,
        train_size=512,
        model_options=dict(hidden_size=32, num_layers=2, num_heads=2),
    )
