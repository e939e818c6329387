"""A damaged checkpoint file (truncated, garbled) is one ModelError line naming it, with a hint naming the
previous complete checkpoint; ``state.json`` is read before any weights; unsafe pickles stay refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch

from tandem.errors import ModelError
from tandem.train.checkpoint import CRITIC_WEIGHTS, load_checkpoint, load_model_weights, save_checkpoint


class TinyModel(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(4, 3)

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(self.state_dict(), str(Path(path) / "model.safetensors"))


class TinyCritic(torch.nn.Module):
    """Saves and loads like tandem.models.value (one safetensors file)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(2, 1)

    def save(self, path: Path) -> None:
        safetensors.torch.save_file(self.state_dict(), str(path))

    def load(self, path: Path) -> None:
        self.load_state_dict(safetensors.torch.load_file(str(path)))


def _checkpoints(root: Path, steps: tuple[int, ...] = (1, 2)) -> Path:
    """Complete checkpoints at ``steps`` (with a critic); returns the newest."""
    model, critic = TinyModel(), TinyCritic()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for step in steps:
        path = save_checkpoint(
            root,
            step,
            model=model,
            tokenizer=None,
            optimizer=optimizer,
            scheduler=scheduler,
            extra_state={"k": step},
            config={},
            critic=critic,
        )
    return path


def _load(path: Path, model: torch.nn.Module | None = None) -> dict:
    model = model or TinyModel(seed=1)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return load_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, critic=TinyCritic())


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _garble(file: Path) -> None:
    file.write_bytes(b"\x80\x02garbage" * 40)


def _empty(file: Path) -> None:
    file.write_bytes(b"")


FILES = ["state.json", "model/model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", CRITIC_WEIGHTS]


@pytest.mark.parametrize("damage", [_truncate, _garble, _empty])
@pytest.mark.parametrize("name", FILES)
def test_damaged_file_is_one_line_naming_it_and_the_previous_checkpoint(tmp_path, name, damage):
    latest = _checkpoints(tmp_path)
    damage(latest / name)
    with pytest.raises(ModelError) as err:
        _load(latest)
    said = str(err.value)
    assert "\n" not in said and said.startswith(f"{latest / name}: damaged or truncated file: "), said
    assert said.endswith(
        f"(checkpoint step-00000002 is damaged: remove or rename {latest} to resume from step-00000001)"
    ), said
    assert "weights_only" not in said  # torch's "re-run with weights_only=False" is wrong for a damaged file


def test_only_checkpoint_damaged_says_there_is_none_before(tmp_path):
    latest = _checkpoints(tmp_path, steps=(3,))
    _truncate(latest / "rng.pt")
    with pytest.raises(ModelError, match=r"rng\.pt: damaged .*no earlier complete one to resume from"):
        _load(latest)


def test_state_json_is_read_before_the_weights(tmp_path):
    latest = _checkpoints(tmp_path)
    _truncate(latest / "state.json")
    model = TinyModel(seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ModelError, match=r"state\.json: damaged or truncated file"):
        _load(latest, model)
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[key])  # nothing loaded before the cheapest check failed


def test_state_json_without_extra_state_is_damaged(tmp_path):
    latest = _checkpoints(tmp_path)
    (latest / "state.json").write_text("[1, 2]")
    with pytest.raises(ModelError, match=r"state\.json: damaged or truncated file: no extra_state object"):
        _load(latest)


def test_pickled_object_is_still_unsafe_not_damaged(tmp_path):
    latest = _checkpoints(tmp_path)
    torch.save({"payload": TinyCritic}, latest / "scheduler.pt")  # a whole archive holding a class
    with pytest.raises(ModelError) as err:
        _load(latest)
    said = str(err.value)
    assert said.startswith(
        f"{latest / 'scheduler.pt'}: cannot load safely (weights_only): Unsupported global"
    )
    assert "\n" not in said and "Re-running" not in said and "remove or rename" not in said


def test_damaged_weights_outside_a_checkpoint_have_no_resume_hint(tmp_path):
    TinyModel().save_pretrained(str(tmp_path / "model"))
    _truncate(tmp_path / "model" / "model.safetensors")
    with pytest.raises(ModelError) as err:
        load_model_weights(tmp_path / "model", TinyModel())
    assert str(err.value).startswith(f"{tmp_path / 'model' / 'model.safetensors'}: damaged or truncated file")
    assert "resume" not in str(err.value)
