"""Checkpoints: atomic save, crash safety, pruning, exact resume, tied HF weights, unsafe files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from tandem.errors import ModelError
from tandem.train import checkpoint as ckpt
from tandem.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from tandem.utils.seed import seed_everything


class TinyModel(torch.nn.Module):
    """A Linear layer with the one Hugging Face method checkpoints need."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(self.state_dict(), str(Path(path) / "model.safetensors"))


class TinyTokenizer:
    def save_pretrained(self, path: str) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def _setup(seed: int = 0) -> tuple[TinyModel, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = TinyModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler


def _train(model: TinyModel, optimizer: torch.optim.Optimizer, scheduler: object, steps: int) -> None:
    """Steps whose data comes from the global generators, so resume is exact only if RNG is restored."""
    for _ in range(steps):
        x = torch.randn(8, 4) + float(np.random.rand()) + random.random()
        loss = model.linear(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()  # type: ignore[attr-defined]


def _save(root: Path, step: int, model: TinyModel, optimizer: torch.optim.Optimizer, **kw: object) -> Path:
    return save_checkpoint(
        root,
        step,
        model=model,
        tokenizer=TinyTokenizer(),
        optimizer=optimizer,
        extra_state={"data_position": step * 8},
        config={"trainer": {"lr": 0.1}},
        **kw,  # type: ignore[arg-type]
    )


def test_save_writes_complete_layout(tmp_path: Path) -> None:
    model, optimizer, scheduler = _setup()
    path = _save(tmp_path, 7, model, optimizer, scheduler=scheduler)
    assert path == tmp_path / "step-00000007"
    names = sorted(p.name for p in path.iterdir())
    assert names == [
        "COMPLETE",
        "config.json",
        "model",
        "optimizer.pt",
        "rng.pt",
        "scheduler.pt",
        "state.json",
    ]
    assert {p.name for p in (path / "model").iterdir()} == {"model.safetensors", "tokenizer.json"}
    state = json.loads((path / "state.json").read_text())
    assert state["step"] == 7 and state["extra_state"] == {"data_position": 56}
    assert "torch" in state["versions"]
    assert json.loads((path / "config.json").read_text()) == {"trainer": {"lr": 0.1}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000007"]


def test_resume_is_exact(tmp_path: Path) -> None:
    seed_everything(3)
    model, optimizer, scheduler = _setup()
    _train(model, optimizer, scheduler, 3)
    path = _save(tmp_path, 3, model, optimizer, scheduler=scheduler)
    _train(model, optimizer, scheduler, 2)  # the uninterrupted run

    seed_everything(99)  # a fresh process: different init, different generators
    resumed, resumed_opt, resumed_sched = _setup(seed=1)
    state = load_checkpoint(path, model=resumed, optimizer=resumed_opt, scheduler=resumed_sched)
    assert state["step"] == 3 and state["extra_state"]["data_position"] == 24
    assert resumed_sched.last_epoch == 3
    _train(resumed, resumed_opt, resumed_sched, 2)

    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    weight = model.linear.weight
    assert torch.equal(
        optimizer.state[weight]["exp_avg"], resumed_opt.state[resumed.linear.weight]["exp_avg"]
    )
    assert scheduler.get_last_lr() == resumed_sched.get_last_lr()


def test_load_restores_rng_unless_disabled(tmp_path: Path) -> None:
    model, optimizer, _ = _setup()
    seed_everything(5)
    path = _save(tmp_path, 1, model, optimizer)
    expected = torch.rand(3)
    load_checkpoint(path, model=model)
    assert torch.equal(torch.rand(3), expected)
    load_checkpoint(path, model=model, restore_rng=False)
    assert not torch.equal(torch.rand(3), expected)


def test_crash_during_save_leaves_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer, _ = _setup()
    first = _save(tmp_path, 1, model, optimizer)

    def crash() -> dict:
        raise RuntimeError("killed mid-save")

    monkeypatch.setattr(ckpt, "rng_state", crash)  # model and optimizer are already written by then
    with pytest.raises(RuntimeError, match="killed mid-save"):
        _save(tmp_path, 2, model, optimizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]
    assert latest_checkpoint(tmp_path) == first


def test_keep_last_prunes_oldest(tmp_path: Path) -> None:
    model, optimizer, _ = _setup()
    for step in range(1, 6):
        _save(tmp_path, step, model, optimizer, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]
    _save(tmp_path, 6, model, optimizer, keep_last=None)
    assert len(list_checkpoints(tmp_path)) == 3
    with pytest.raises(ValueError, match="keep_last"):
        _save(tmp_path, 7, model, optimizer, keep_last=0)


def test_latest_ignores_temp_and_incomplete_folders(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    model, optimizer, _ = _setup()
    _save(tmp_path, 9, model, optimizer)
    _save(tmp_path, 10, model, optimizer)
    (tmp_path / "step-00000100").mkdir()  # no COMPLETE marker
    (tmp_path / ".step-00000200.tmp-123").mkdir()
    (tmp_path / ".step-00000200.tmp-123" / "COMPLETE").write_text("")
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000010"  # numeric, not lexical, order
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000009", "step-00000010"]
    with pytest.raises(ModelError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path / "step-00000100", model=model)


def test_load_rejects_mismatched_weights(tmp_path: Path) -> None:
    model, optimizer, _ = _setup()
    path = _save(tmp_path, 1, model, optimizer)
    other = torch.nn.Sequential(torch.nn.Linear(4, 3))
    with pytest.raises(ModelError, match=r"missing: 0\.bias, 0\.weight; unexpected: linear\.bias"):
        load_checkpoint(path, model=other)


def test_load_refuses_pickled_objects(tmp_path: Path) -> None:
    model, optimizer, scheduler = _setup()
    path = _save(tmp_path, 1, model, optimizer, scheduler=scheduler)
    torch.save({"payload": TinyTokenizer()}, path / "scheduler.pt")
    with pytest.raises(ModelError, match=r"scheduler\.pt: cannot load safely"):
        load_checkpoint(path, model=model, scheduler=scheduler)


def test_tied_hf_llama_round_trip(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=32,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(
        tmp_path, 1, model=model, tokenizer=None, optimizer=optimizer, extra_state={}, config={}
    )
    torch.manual_seed(1)
    fresh = transformers.LlamaForCausalLM(config)
    load_checkpoint(path, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters()))
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()


def test_pydantic_config_is_saved_as_plain_json(tmp_path: Path) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Trainer(pydantic.BaseModel):
        lr: float = 1e-5
        out: Path = Path("runs/x")

    model, optimizer, _ = _setup()
    path = save_checkpoint(
        tmp_path, 1, model=model, tokenizer=None, optimizer=optimizer, extra_state={}, config=Trainer()
    )
    assert json.loads((path / "config.json").read_text()) == {"lr": 1e-5, "out": "runs/x"}


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_step_tmp_pid_folders_of_dead_processes_are_cleaned(tmp_path: Path) -> None:
    import subprocess
    import sys

    model, optimizer, _ = _setup()
    first = _save(tmp_path, 1, model, optimizer)
    dead, live = _dead_pid(), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphans = [
            f".step-00000002.tmp-{dead}",
            f".step-00000001.deleting-{dead}",
            f".step-00000001.old-{dead}",
        ]
        for name in orphans:
            (tmp_path / name / "model").mkdir(parents=True)
            (tmp_path / name / "model" / "model.safetensors").write_bytes(b"x" * 1000)
        in_progress = tmp_path / f".step-00000003.tmp-{live.pid}"
        in_progress.mkdir()
        lookalike = tmp_path / ".step-00000002.tmp-notapid"
        lookalike.mkdir()
        _save(tmp_path, 2, model, optimizer)  # every save first clears what dead saves left
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == sorted(["step-00000001", "step-00000002", in_progress.name, lookalike.name])
        assert latest_checkpoint(tmp_path) == tmp_path / "step-00000002" and first.is_dir()
    finally:
        live.kill()
        live.wait()


def test_old_folder_of_an_interrupted_replacement_is_restored_not_deleted(tmp_path: Path) -> None:
    model, optimizer, _ = _setup()
    first = _save(tmp_path, 1, model, optimizer)
    aside = tmp_path / f".step-00000001.old-{_dead_pid()}"
    first.rename(aside)  # killed between moving step 1 aside and renaming its replacement in
    assert ckpt.clean_leftovers(tmp_path) == []
    assert latest_checkpoint(tmp_path) == first and not aside.exists()
