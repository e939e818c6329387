"""``run.plugins``: a user's module, outside the repository, registers an advantage estimator and a policy
loss that a YAML config then names; rollout workers import it too, a fresh process reading the run's
config.yaml finds it, and a broken plug-in is one line, not a traceback or a silently wrong update."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app

PLUGIN = '''
import dataclasses

import torch

from tandem.algos import ADVANTAGE_ESTIMATORS, CURRICULA, POLICY_LOSSES, AdvantageSpec, group_stats


def centred(inp):
    """Group-mean baseline, broadcast over the response tokens: [B, T] as the seam asks."""
    mean, _, _ = group_stats(inp.scores, inp.group_ids)
    adv = (inp.scores - mean)[:, None].expand_as(inp.response_mask).float()
    return adv, inp.scores[:, None].expand_as(inp.response_mask).float()


def per_sequence(inp):
    """The mistake a TRL user makes: one advantage per sample, [B]."""
    mean, _, _ = group_stats(inp.scores, inp.group_ids)
    return inp.scores - mean, inp.scores


ADVANTAGE_ESTIMATORS.add("plugin_centred", AdvantageSpec(fn=centred, group_relative=True))
ADVANTAGE_ESTIMATORS.add("plugin_per_sequence", AdvantageSpec(fn=per_sequence, group_relative=True))
POLICY_LOSSES.add("plugin_clip", dataclasses.replace(POLICY_LOSSES.get("ppo_clip")))
CURRICULA.add("plugin_uniform", CURRICULA.get("uniform"))  # looked up where prompts are drawn: the workers


def keyword_form(scores, response_mask):
    """compute_advantages' keyword signature, not the seam's one AdvantageInputs."""
    return scores, scores


def broken_loss(inp):
    raise RuntimeError("my loss is broken")


def per_sequence_loss(inp):
    """A loss per sample, [B]: the aggregation wants one per token."""
    return -(inp.advantages * inp.logprobs).sum(-1), {}


ADVANTAGE_ESTIMATORS.add("plugin_keyword_form", AdvantageSpec(fn=keyword_form, group_relative=True))
POLICY_LOSSES.add("plugin_broken", dataclasses.replace(POLICY_LOSSES.get("ppo_clip"), fn=broken_loss))
POLICY_LOSSES.add("plugin_per_sequence", dataclasses.replace(POLICY_LOSSES.get("ppo_clip"), fn=per_sequence_loss))
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """One plug-in file for the module: imported once per path, so its names are registered once."""
    path = tmp_path_factory.mktemp("plugin") / "my_algos.py"
    path.write_text(PLUGIN)
    yield path
    from tandem.algos import ADVANTAGE_ESTIMATORS, CURRICULA, POLICY_LOSSES

    for registry, name in (
        (ADVANTAGE_ESTIMATORS, "plugin_centred"),
        (ADVANTAGE_ESTIMATORS, "plugin_per_sequence"),
        (POLICY_LOSSES, "plugin_clip"),
        (CURRICULA, "plugin_uniform"),
        (ADVANTAGE_ESTIMATORS, "plugin_keyword_form"),
        (POLICY_LOSSES, "plugin_broken"),
        (POLICY_LOSSES, "plugin_per_sequence"),
    ):
        if name in registry:
            registry.unregister(name)


def _config(tmp_path: Path, model: Path, plugin: Path, advantage: str = "plugin_centred") -> Path:
    data = {
        "run": {"output_dir": str(tmp_path / "run"), "plugins": [os.path.relpath(plugin)]},
        "model": {"path": str(model)},
        "data": {"task": "arith", "prompts_per_step": 2, "train_size": 8, "eval_size": 0},
        "rollout": {"n": 2, "max_new_tokens": 2},
        "algorithm": {"name": "grpo", "advantage": advantage, "policy_loss": "plugin_clip"},
        "trainer": {"total_steps": 2, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        "checkpoint": {"every": 0, "save_final": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _train(config: Path, *overrides: str):
    return CliRunner().invoke(app, ["train", str(config), *overrides, "--no-progress"])


def test_a_plugin_estimator_and_loss_train_and_the_run_reads_back_elsewhere(tmp_path, tiny_model_dir, plugin):
    done = _train(_config(tmp_path, tiny_model_dir, plugin))
    assert done.exit_code == 0, done.output
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert written["run"]["plugins"] == [str(plugin.resolve())]  # absolute: readable from any folder
    assert written["algorithm"]["advantage"] == "plugin_centred"
    # a new process in another folder validates the run's config: the plug-in is imported first
    code = "import sys; from tandem.config import load_config; print(load_config(sys.argv[1]).algorithm.advantage)"
    read = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run" / "config.yaml")],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )
    assert read.returncode == 0 and read.stdout.strip() == "plugin_centred", read.stderr[-800:]


def test_a_plugin_estimator_runs_decoupled(tmp_path, tiny_model_dir, plugin):
    """The rollout workers (other processes) import the plug-in too: they draw prompts with its curriculum."""
    cfg = _config(tmp_path, tiny_model_dir, plugin)
    done = _train(cfg, "architecture.mode=decoupled", "data.curriculum.kind=plugin_uniform")
    assert done.exit_code == 0, done.output


def test_a_plugin_that_cannot_be_imported_is_one_line_where_the_config_names_it(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, tmp_path / "absent.py")
    cfg.write_text(cfg.read_text().replace(os.path.relpath(tmp_path / "absent.py"), "no_such_plugin_mod"))
    bad = _train(cfg)
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    said = " ".join(bad.output.split())
    assert f"{cfg}:3: run.plugins.0: 'no_such_plugin_mod': module 'no_such_plugin_mod' not found" in said, (
        said
    )
    raises = tmp_path / "raises.py"
    raises.write_text("import json\n\njson.loads('{')\n")
    bad = _train(cfg, f"run.plugins=[{raises}]")
    said = " ".join(bad.output.split())
    assert (
        bad.exit_code == 2 and f"{raises}:3: '{raises}': importing 'raises.py' raised JSONDecodeError" in said
    )


def test_a_plugin_estimator_of_the_wrong_shape_is_refused_by_name(tmp_path, tiny_model_dir, plugin):
    """[B] advantages would broadcast along the token axis and train on the wrong numbers."""
    bad = _train(_config(tmp_path, tiny_model_dir, plugin, advantage="plugin_per_sequence"))
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    said = " ".join(bad.output.split())
    assert "algorithm.advantage: advantage estimator 'plugin_per_sequence' returned advantages [4]" in said, (
        said
    )
    assert not (tmp_path / "run").exists()  # it failed in the first step: nothing left behind


def test_a_plugin_loss_runs_on_data_parallel_learner_ranks(tmp_path, tiny_model_dir, plugin):
    """Learner ranks 1..M-1 (other processes) build the update with the plug-in's loss."""
    done = _train(_config(tmp_path, tiny_model_dir, plugin), "trainer.world_size=2")
    assert done.exit_code == 0, done.output


def test_a_bare_function_is_refused_where_a_spec_is_registered():
    from tandem.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    with pytest.raises(
        TypeError, match=r"advantage estimator 'bare': register AdvantageSpec\(fn=...\), not a function"
    ):
        ADVANTAGE_ESTIMATORS.add("bare", lambda inp: inp)
    with pytest.raises(TypeError, match=r"policy loss 'bare': register PolicyLossSpec\(fn=...\)"):

        @POLICY_LOSSES.register("bare")
        def loss(inp):  # the decorator form help() shows: a bare function is not a spec
            return inp

    assert "bare" not in ADVANTAGE_ESTIMATORS and "bare" not in POLICY_LOSSES


def test_a_plugin_that_raises_is_one_line_naming_it_and_its_line(tmp_path, tiny_model_dir, plugin):
    """A plug-in's exception names the entry, the config key that chose it and the line in the user's file."""
    bad = _train(_config(tmp_path, tiny_model_dir, plugin, advantage="plugin_keyword_form"))
    said = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "Traceback" not in bad.output, bad.output
    assert "algorithm.advantage: advantage estimator 'plugin_keyword_form' raised TypeError" in said, said
    assert "missing 1 required positional argument" in said
    bad = _train(_config(tmp_path, tiny_model_dir, plugin), "algorithm.policy_loss=plugin_broken")
    said = " ".join(bad.output.split())
    line = PLUGIN.splitlines().index('    raise RuntimeError("my loss is broken")') + 1
    assert bad.exit_code == 2 and "Traceback" not in bad.output, bad.output
    assert (
        f"algorithm.policy_loss: policy loss 'plugin_broken' raised RuntimeError at {plugin}:{line}: my loss is broken"
        in said
    ), said

    bad = _train(_config(tmp_path, tiny_model_dir, plugin), "algorithm.policy_loss=plugin_per_sequence")
    said = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "Traceback" not in bad.output, bad.output
    assert "algorithm.policy_loss: policy loss 'plugin_per_sequence' returned a loss of shape [4]" in said, (
        said
    )
