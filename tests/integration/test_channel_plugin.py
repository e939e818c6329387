"""A trajectory channel is one class plus one ``BACKENDS`` line: ``FolderChannel``, defined in this test,
declares its options, runtimes and ``from_config``, is registered for the test only, and carries a
decoupled run (a rollout worker process puts, the learner gets) with nothing else changed."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
import torch
from pydantic import Field
from run_checks import step_rows

from tandem.channels import (
    BACKENDS,
    ChannelOptions,
    ChannelSetting,
    Delivery,
    TrajectoryMessage,
    check_channel,
)
from tandem.channels.serialize import decode_message, encode_message
from tandem.config import build_config
from tandem.errors import ConfigError


class FolderChannel:
    """Messages as files in a spool folder: ``put`` writes one file atomically (temp name, then rename),
    ``get`` takes the oldest. One consumer; not durable."""

    durable = False
    runtimes = ("embedded",)

    class Options(ChannelOptions):
        folder: str = Field(..., description="Spool folder shared by the workers and the learner.")

    @classmethod
    def from_config(cls, options: Options, setting: ChannelSetting) -> FolderChannel:
        return cls(Path(options.folder) / setting.run_name)

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.delivered = 0  # messages this process took out

    def put(self, message: TrajectoryMessage) -> None:
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        tmp = self.folder / f".{name}.tmp"
        tmp.write_bytes(encode_message(message))
        os.replace(tmp, self.folder / f"{name}.msg")

    def get(self, timeout: float) -> Delivery | None:
        deadline = time.monotonic() + timeout
        while True:
            files = sorted(self.folder.glob("*.msg"))
            if files:
                message = decode_message(files[0].read_bytes())
                files[0].unlink()
                self.delivered += 1
                return Delivery(message=message, delivery_id=f"folder-{message.ticket}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def ack(self, delivery_ids: list[str]) -> None:
        """Nothing to confirm: a taken file is gone."""

    def recover(self) -> list[Delivery]:
        return []  # not durable

    def depth(self) -> int:
        return len(list(self.folder.glob("*.msg")))

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture
def folder_backend(monkeypatch):
    monkeypatch.setitem(BACKENDS, "folder", f"{__name__}:FolderChannel")  # the one registry line
    return "folder"


def _cfg(model_dir, out, channel, **arch):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 5, "name": "plugin"},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "algorithm": {"name": "grpo"},
            "trainer": {"total_steps": 2, "lr": 3e-3},
            "architecture": {
                "mode": "decoupled",
                "staleness": 0,
                "num_workers": 1,
                "channel": channel,
                **arch,
            },
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _check(cfg) -> None:
    ch = cfg.architecture.channel
    check_channel(ch.backend, ch.options, cfg.architecture.runtime)


def test_the_registry_checks_a_channel_defined_here(folder_backend, tiny_model_dir, tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown channel backend 'kafka'; valid: folder, queue, ray, redis"
    ):
        _check(_cfg(tiny_model_dir, tmp_path, {"backend": "kafka"}))
    with pytest.raises(ConfigError, match=r"^architecture.channel.options.folder: Field required$"):
        _check(_cfg(tiny_model_dir, tmp_path, {"backend": folder_backend}))
    spool = {"backend": folder_backend, "options": {"folder": str(tmp_path)}}
    with pytest.raises(ConfigError, match=r"channel 'folder' cannot serve architecture.runtime=ray"):
        _check(_cfg(tiny_model_dir, tmp_path, spool, runtime="ray"))
    _check(_cfg(tiny_model_dir, tmp_path, spool))


def test_a_channel_defined_here_carries_a_decoupled_run(folder_backend, tiny_model_dir, tmp_path):
    # imported here: the worker process imports this module to unpickle FolderChannel, and needs no more
    from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled

    torch.set_num_threads(1)
    spool = tmp_path / "spool"
    channel = {"backend": folder_backend, "options": {"folder": str(spool)}}
    seen: list[tuple[str, int]] = []

    def on_step(run, step):
        seen.append((type(run.channel).__name__, run.channel.delivered))

    result = train_decoupled(
        _cfg(tiny_model_dir, tmp_path / "run", channel), progress=False, hooks=RunHooks(on_step=on_step)
    )
    assert result.steps == 2
    assert seen == [("FolderChannel", 1), ("FolderChannel", 2)]  # each step trained a batch from the folder
    assert (spool / "plugin").is_dir()  # from_config used the run's name
    rows = step_rows(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["staleness/step_lag"] == 0.0 for r in rows)
