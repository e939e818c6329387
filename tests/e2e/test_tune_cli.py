"""``tandem tune`` end to end on a tiny model: the rung plan runs, the best of rung 0 is the one promoted,
best.yaml is a valid config with the winner's overrides; bad input is one line. (Mechanism, not outcome.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import load_config


def _config(tmp_path: Path, model_dir: Path) -> Path:
    data = {
        "run": {"name": "t", "seed": 0},
        "model": {"path": str(model_dir)},
        "data": {"task": "arith", "prompts_per_step": 2, "train_size": 8, "eval_size": 4},
        "rollout": {"n": 2, "max_new_tokens": 2},
        "trainer": {"total_steps": 2, "lr": 1e-3},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_tune_runs_the_plan_and_writes_the_best_config(tiny_model_dir, tmp_path) -> None:
    cfg = _config(tmp_path, tiny_model_dir)
    out = tmp_path / "tune"
    args = ["tune", str(cfg), "--budget", "4", "--min-steps", "1", "--out", str(out), "--no-confirm"]
    result = CliRunner().invoke(app, [*args, "--space", "trainer.lr=1e-3,3e-3"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert [(r["trial"], r["steps"]) for r in rows[:2]] == [(0, 1), (1, 1)] and rows[2]["steps"] == 2
    first = max(rows[:2], key=lambda r: (r["eval/accuracy"], -r["trial"]))
    assert rows[2]["trial"] == first["trial"]  # the better first-rung run is the one trained longer
    best = load_config(out / "best.yaml")
    winner = rows[2]["overrides"][0].split("=")[1]
    assert best.trainer.lr == float(winner)
    assert best.trainer.total_steps == 2  # the config's length, not the rung's
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"00001-1e-3", "00001-3e-3", f"00002-{winner}"}
    assert "tune (2 candidates)" in result.output and "4/4" in result.output  # the sweep's bar: 1+1+2 steps
    assert all(r["num_prompts"] == 4 for r in rows)  # data.eval_size: what each score was counted on
    assert "noise on 4 prompts)" in result.output  # ±2 binomial standard errors beside each score


def _confirmed_sweep(cfg: Path, out: Path) -> tuple[object, list[dict], str]:
    """A sweep whose candidates all differ from the config (lr 1e-3): the winner must be confirmed."""
    args = ["tune", str(cfg), "--budget", "6", "--min-steps", "1", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--space", "trainer.lr=2e-3,3e-3"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    winner = rows[2]["overrides"][0].split("=")[1]
    return result, rows, winner


def test_tune_keeps_the_config_unless_the_winner_is_shown_better(tiny_model_dir, tmp_path) -> None:
    """With 4 held-out prompts no sign test can reject (p >= 0.125): the config as given is kept."""
    cfg, out = _config(tmp_path, tiny_model_dir), tmp_path / "tune"
    result, rows, winner = _confirmed_sweep(cfg, out)
    # plan: 2 x 1 step, 1 x 2 steps, then the config itself for 2 steps (budget 6 held back for it)
    assert [(r.get("trial"), r.get("steps")) for r in rows[:4]] == [
        (0, 1),
        (1, 1),
        (rows[2]["trial"], 2),
        (-1, 2),
    ]
    assert rows[3]["overrides"] == [] and rows[4]["overrides"] == [f"trainer.lr={winner}"]
    verdict = rows[4]["confirm"]
    assert verdict["promote"] is False and verdict["p_value"] >= 0.125
    assert verdict["wins"] + verdict["ties"] + verdict["losses"] == 4  # data.eval_size prompts judged
    assert verdict["on"] == "new test prompts of task arith (none held out)"  # not those ranked on
    assert load_config(out / "best.yaml").trainer.lr == 1e-3  # the config as given
    for run in (f"00002-{winner}", "00002-config"):  # the two final models that were compared
        assert any((out / run / "checkpoints").glob("step-*/COMPLETE")), run
    assert "does not replace the config as given" in result.output and "6/6" in result.output
    assert "of 4 new test prompts of task arith" in " ".join(result.output.split())


def test_tune_promotes_a_winner_the_confirmation_accepts(tiny_model_dir, tmp_path, monkeypatch) -> None:
    """The code around the verdict: a promoting verdict puts the winner in best.yaml."""
    import tandem.evaluate.confirm as confirmation

    seen: list[tuple[str, str]] = []

    def accept(
        pairs: list[tuple[Path, Path]], alpha: float, seed: int, prompts: Path | None, on: str | None
    ) -> dict:
        seen.extend((incumbent.name, winner.name) for incumbent, winner in pairs)
        return {"promote": True, "wins": 3, "ties": 1, "losses": 0, "p_value": 0.01, "alpha": alpha}

    monkeypatch.setattr(confirmation, "confirm_winner", accept)
    cfg, out = _config(tmp_path, tiny_model_dir), tmp_path / "tune"
    result, _, winner = _confirmed_sweep(cfg, out)
    assert seen == [("00002-config", f"00002-{winner}")]
    assert load_config(out / "best.yaml").trainer.lr == float(winner)
    assert f"trainer.lr={winner} replaces the config as given" in result.output


def test_resume_reuses_finished_runs_of_the_same_config_only(tiny_model_dir, tmp_path, monkeypatch) -> None:
    """--resume after an interruption: finished runs with the same resolved config are read back, the
    unfinished one (no summary.json) trains again, and the sweep ends as the uninterrupted one did."""
    import tandem.orchestration.runner as runner
    from tandem.orchestration.tune import finished_run

    cfg, out = _config(tmp_path, tiny_model_dir), tmp_path / "tune"
    _, first, winner = _confirmed_sweep(cfg, out)
    (out / "00001-2e-3" / "summary.json").unlink()  # as if the sweep had stopped inside this run
    trained: list[str] = []
    real_train = runner.train

    def counting_train(run_cfg, *args, **kwargs):
        trained.append(Path(run_cfg.run.output_dir).name)
        return real_train(run_cfg, *args, **kwargs)

    monkeypatch.setattr(runner, "train", counting_train)
    args = ["tune", str(cfg), "--budget", "6", "--min-steps", "1", "--out", str(out), "--resume"]
    result = CliRunner().invoke(app, [*args, "--space", "trainer.lr=2e-3,3e-3"])
    assert result.exit_code == 0, result.output
    assert trained == ["00001-2e-3"] and result.output.count("reused") == 3
    again = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert [r.get("eval/accuracy") for r in again] == [r.get("eval/accuracy") for r in first]
    assert again[-1]["overrides"] == [f"trainer.lr={winner}"]
    written = (out / "00002-config" / "config.yaml").read_text()
    assert finished_run(out / "00002-config", written) is not None
    assert finished_run(out / "00002-config", written.replace("lr: 0.001", "lr: 0.002")) is None
    copied = written.replace(str(out / "00002-config"), str(tmp_path / "copy" / "00002-config"))
    assert (
        copied != written and finished_run(out / "00002-config", copied) is not None
    )  # a copied sweep resumes
    summary = out / "00002-config" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "stopped_by_alert": 1}))
    assert finished_run(out / "00002-config", written) is None  # an alert's stop is not a finished run


def _file_config(tmp_path: Path, model_dir: Path, reward: str = "digits_reward.py:digit_share") -> Path:
    """A config on prompt files (with an ``answer`` column) scored by ``reward`` (no task), 4 held-out."""
    here = Path(__file__).parent
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(12)]
    for name, part in (("train", rows[:8]), ("eval", rows[8:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    data = yaml.safe_load(_config(tmp_path, model_dir).read_text())
    data["data"] = {
        "task": None,
        "train_file": str(tmp_path / "train.jsonl"),
        "eval_file": str(tmp_path / "eval.jsonl"),
        "prompts_per_step": 2,
        "eval_size": 4,
    }
    data["reward"] = {
        "task_reward": False,
        "functions": [{"path": f"{here / reward}"}],
    }
    path = tmp_path / "file_cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_confirmation_judges_on_the_confirm_file(tiny_model_dir, tmp_path) -> None:
    """--confirm-file's prompts, not the 4 held-out ones the sweep ranked on, decide the verdict."""
    cfg, out = _file_config(tmp_path, tiny_model_dir), tmp_path / "tune"
    confirm = tmp_path / "confirm.jsonl"
    confirm.write_text("".join(json.dumps({"prompt": f"{a}-1="}) + "\n" for a in range(20, 27)))
    args = ["tune", str(cfg), "--budget", "6", "--min-steps", "1", "--out", str(out)]
    result = CliRunner().invoke(
        app, [*args, "--space", "trainer.lr=2e-3,3e-3", "--confirm-file", str(confirm)]
    )
    assert result.exit_code == 0, result.output
    verdict = json.loads((out / "tune.jsonl").read_text().splitlines()[-1])["confirm"]
    assert verdict["wins"] + verdict["ties"] + verdict["losses"] == 7  # the file's 7 prompts


def test_a_large_held_out_file_is_split_into_ranking_and_confirming_halves(tiny_model_dir, tmp_path) -> None:
    """Without --confirm-file, a prompt-file config's runs rank on one half of its held-out file and the
    winner is confirmed on the other: no prompt a choice was made on judges it."""
    cfg, out = _file_config(tmp_path, tiny_model_dir), tmp_path / "tune"
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(20, 230)]  # 210 distinct prompts
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["tune", str(cfg), "--budget", "6", "--min-steps", "1", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--space", "trainer.lr=2e-3,3e-3"])
    assert result.exit_code == 0, result.output
    assert "105 rows rank the sweep, 105 confirm its winner" in result.output
    for run in out.glob("0*"):
        assert yaml.safe_load((run / "config.yaml").read_text())["data"]["eval_file"] == str(
            out / "held_out_rank.jsonl"
        )
    verdict = json.loads((out / "tune.jsonl").read_text().splitlines()[-1])["confirm"]
    assert verdict["wins"] + verdict["ties"] + verdict["losses"] == 105
    assert verdict["on"].endswith("the sweep did not rank on")
    ranked = {json.loads(line)["prompt"] for line in (out / "held_out_rank.jsonl").read_text().splitlines()}
    confirmed = {
        json.loads(line)["prompt"] for line in (out / "held_out_confirm.jsonl").read_text().splitlines()
    }
    assert not ranked & confirmed and len(ranked | confirmed) == 210
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["data"]["eval_file"] == str(tmp_path / "eval.jsonl")  # the user's file, not a half


def test_a_bad_held_out_row_is_one_line_before_the_split_or_any_run(tiny_model_dir, tmp_path) -> None:
    cfg, out = _file_config(tmp_path, tiny_model_dir), tmp_path / "tune"
    lines = [json.dumps({"prompt": f"{a}+{a}="}) + "\n" for a in range(210)]
    lines[6] = '{"prompt": 7\n'
    (tmp_path / "eval.jsonl").write_text("".join(lines))
    res = CliRunner().invoke(app, ["tune", str(cfg), "--out", str(out)])
    assert res.exit_code == 2 and f"{tmp_path / 'eval.jsonl'}:7" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()


def test_bad_confirm_file_is_one_line_before_anything_trains(tiny_model_dir, tmp_path) -> None:
    cfg = _file_config(tmp_path, tiny_model_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1="}) + "\n{not json\n")
    out = tmp_path / "a"
    res = CliRunner().invoke(app, ["tune", str(cfg), "--confirm-file", str(bad), "--out", str(out)])
    assert res.exit_code == 2 and f"{bad}:2" in res.output and not out.exists()
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    off = [str(cfg), "--confirm-file", str(good), "--no-confirm", "--out", str(out)]
    res = CliRunner().invoke(app, ["tune", *off])
    assert res.exit_code == 2 and "--confirm-file: unused: --no-confirm is given" in res.output
    task_cfg = [str(_config(tmp_path, tiny_model_dir)), "--confirm-file", str(good), "--out", str(out)]
    res = CliRunner().invoke(app, ["tune", *task_cfg])
    assert res.exit_code == 2 and "no reward.functions" in res.output and not out.exists()
    needs = _file_config(tmp_path, tiny_model_dir, "bad_rewards.py:starts_with_answer")
    res = CliRunner().invoke(app, ["tune", str(needs), "--confirm-file", str(good), "--out", str(out)])
    assert res.exit_code == 2 and "--confirm-file: reward 'starts_with_answer'" in res.output
    assert f"needs argument 'answer', which no column of {good} provides" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()  # the file has no answer column
    scorer = tmp_path / "scorer.py"  # a function that cannot score the file's rows: found by scoring one
    scorer.write_text("def f(prompts, completions, **kw):\n    raise ValueError('no')\n")
    raises = _file_config(tmp_path, tiny_model_dir, f"{scorer}:f")
    res = CliRunner().invoke(app, ["tune", str(raises), "--confirm-file", str(good), "--out", str(out)])
    assert res.exit_code == 2 and f"--confirm-file {good}:1: reward 'f' raised ValueError" in res.output
    assert not out.exists()


def test_tune_bad_space_and_small_budget_are_one_line(tiny_model_dir, tmp_path) -> None:
    cfg = _config(tmp_path, tiny_model_dir)
    bad = CliRunner().invoke(app, ["tune", str(cfg), "--space", "trainer.lr", "--out", str(tmp_path / "a")])
    assert bad.exit_code == 2 and "--space 'trainer.lr' is not KEY=V1,V2" in bad.output
    swept = ["tune", str(cfg), "--space", "trainer.total_steps=2,4", "--out", str(tmp_path / "f")]
    controlled = CliRunner().invoke(
        app, swept
    )  # every trial's length is the sweep's: the value would be lost
    assert (
        controlled.exit_code == 2 and "'trainer.total_steps' is set by the sweep itself" in controlled.output
    )
    small = CliRunner().invoke(app, ["tune", str(cfg), "--budget", "1", "--out", str(tmp_path / "b")])
    assert small.exit_code == 2 and "too small for 6 candidates" in small.output
    decoupled = [str(cfg), "architecture.mode=decoupled", "--budget", "1", "--out", str(tmp_path / "d")]
    dec = CliRunner().invoke(app, ["tune", *decoupled])  # adaptive group size runs decoupled too
    assert dec.exit_code == 2 and "too small for 6 candidates" in dec.output
    dyn = [str(cfg), "algorithm.dynamic_sampling=true", "--budget", "1", "--out", str(tmp_path / "e")]
    left = CliRunner().invoke(app, ["tune", *dyn])  # a default dimension the config cannot take is left out
    assert left.exit_code == 2 and "too small for 3 candidates" in left.output
    assert "leaving out algorithm.adaptive_group.enabled" in left.output and "dynamic_sampling" in left.output
    key = CliRunner().invoke(
        app, ["tune", str(cfg), "--space", "trainer.lrr=1", "--out", str(tmp_path / "c")]
    )
    assert key.exit_code == 2 and "trainer.lrr" in key.output
    alpha = CliRunner().invoke(app, ["tune", str(cfg), "--alpha", "1.5", "--out", str(tmp_path / "f")])
    assert alpha.exit_code == 2 and "--alpha 1.5 is not a significance level" in alpha.output
    no_eval = CliRunner().invoke(app, ["tune", str(cfg), "data.eval_size=0", "--out", str(tmp_path / "g")])
    assert no_eval.exit_code == 2 and "data.eval_size: tuning needs a held-out set" in no_eval.output
    assert not any((tmp_path / d).exists() for d in "abcdefg")


def test_default_space_is_relative_to_the_configs_learning_rate() -> None:
    from tandem.cli.tune import default_space

    space = default_space(3e-4)
    assert [float(v) for v in space["trainer.lr"]] == pytest.approx([1e-4, 3e-4, 9e-4])
    assert [float(v) for v in default_space(1e-6)["trainer.lr"]] == pytest.approx([3.33e-7, 1e-6, 3e-6])
    assert space["algorithm.adaptive_group.enabled"] == ["false", "true"]


def test_confirmation_is_skipped_with_a_reason_where_it_cannot_judge(tiny_model_dir, tmp_path) -> None:
    from tandem.evaluate.confirm import confirm_unsupported

    cfg = load_config(_config(tmp_path, tiny_model_dir))
    assert confirm_unsupported(cfg, "eval/accuracy") is None
    assert confirm_unsupported(cfg, "eval/reward_mean") is None
    assert "--metric eval/length_mean is not scored per prompt" in confirm_unsupported(
        cfg, "eval/length_mean"
    )


def test_confirmation_prompts_are_new_unless_the_task_has_too_few(tmp_path, monkeypatch) -> None:
    """A task config is confirmed on a new test draw without the held-out prompts; where the task's test
    split holds fewer than half as many others (1-digit sums: ~50 test prompts), on the held-out ones."""
    import tandem.evaluate.abtest as abtest
    import tandem.evaluate.targets as targets
    from tandem.evaluate.confirm import confirm_winner

    calls: list[tuple[int, set[str]]] = []

    def judged(a, b, judge, settings, **kwargs) -> dict:  # stands in for the two models' A/B run
        calls.append((settings.seed, set(kwargs.get("exclude_prompts", ()))))
        return {"pairs": [{"prompt": "1+1=", "outcome": o} for o in (1, 0, 0, -1)]}

    monkeypatch.setattr(abtest, "run_abtest", judged)
    verdicts = []
    for digits in (2, 1):
        data = {"task": "arith", "task_options": {"digits": digits, "ops": "+"}, "eval_size": 100}
        path = tmp_path / f"cfg{digits}.yaml"
        path.write_text(yaml.safe_dump({"model": {"path": str(tmp_path)}, "data": data}))
        cfg = load_config(path)
        monkeypatch.setattr(
            targets, "resolve_target", lambda _p, cfg=cfg: targets.Target(tmp_path, None, cfg)
        )
        verdicts.append(confirm_winner([(tmp_path / "a", tmp_path / "b")], 0.05, seed=0)["on"])
    held_out = {r["prompt"] for r in targets.eval_data(load_config(tmp_path / "cfg2.yaml")).rows}
    assert calls[0] == (1, held_out) and len(held_out) > 90  # a new draw, the held-out prompts left out
    assert verdicts[0] == "new test prompts of task arith (none held out)"
    assert calls[1] == (0, set()) and verdicts[1].startswith("held-out prompts (a new draw of task arith")


def test_pairs_on_the_same_prompts_give_one_outcome_per_prompt(tmp_path, monkeypatch) -> None:
    """A prompt file judged for two training seeds: each prompt counts once, by the sign of its summed
    outcomes (won once and lost once is a tie), so the sign test sees independent prompts only."""
    import tandem.evaluate.abtest as abtest
    import tandem.evaluate.targets as targets
    from tandem.evaluate.confirm import confirm_winner, per_prompt_net

    per_seed = {"a0": [1, 1, -1, 0, 1], "a1": [1, -1, -1, 0, 0]}

    def judged(a, b, judge, settings, **kwargs) -> dict:  # stands in for the two models' A/B run
        assert kwargs == {"eval_file": str(tmp_path / "confirm.jsonl")} and settings.seed == 3
        return {"pairs": [{"prompt": f"p{i}", "outcome": o} for i, o in enumerate(per_seed[a.name])]}

    monkeypatch.setattr(abtest, "run_abtest", judged)
    monkeypatch.setattr(targets, "resolve_target", lambda _p: targets.Target(tmp_path, None, None))
    pairs = [(tmp_path / "a0", tmp_path / "b0"), (tmp_path / "a1", tmp_path / "b1")]
    verdict = confirm_winner(pairs, 0.05, seed=3, prompts=tmp_path / "confirm.jsonl")
    assert (verdict["wins"], verdict["ties"], verdict["losses"]) == (2, 2, 1)
    assert verdict["on"].endswith(", 2 training seeds summed per prompt") and verdict["seeds"] == 2
    assert per_prompt_net([([1, -1, 1], ["x", "y", "z"])] * 3) == [1, -1, 1]
    assert per_prompt_net([([1, 1], ["x", "y"]), ([1, -1], ["x", "y"]), ([-1, -1], ["x", "y"])]) == [1, -1]
    with pytest.raises(ValueError, match="asked different ones"):
        per_prompt_net([([1], ["x"]), ([1], ["y"])])


def test_confirm_seeds_retrains_both_configs_and_pools_the_pairs(tiny_model_dir, tmp_path) -> None:
    """--confirm-seeds 2: the config and the winner are also trained on run.seed+1, each pair is judged on
    its own new prompts, and one sign test runs on all of them."""
    cfg, out = _config(tmp_path, tiny_model_dir), tmp_path / "tune"
    args = ["tune", str(cfg), "--budget", "10", "--min-steps", "1", "--out", str(out), "--confirm-seeds", "2"]
    result = CliRunner().invoke(app, [*args, "--space", "trainer.lr=2e-3,3e-3"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    winner = rows[2]["overrides"][0].split("=")[1]
    extra = [(r["overrides"], r["steps"], r.get("seed")) for r in rows[3:6]]
    assert extra == [([], 2, None), ([], 2, 1), ([f"trainer.lr={winner}"], 2, 1)]
    for run in ("00002-config", "00002-config-s1", f"00002-{winner}", f"00002-{winner}-s1"):
        assert any((out / run / "checkpoints").glob("step-*/COMPLETE")), run
    assert load_config(out / "00002-config-s1" / "config.yaml").run.seed == 1
    verdict = rows[6]["confirm"]
    assert verdict["seeds"] == 2 and verdict["wins"] + verdict["ties"] + verdict["losses"] == 8
    assert verdict["on"] == "new test prompts of task arith (none held out), 2 training seeds"
    assert "10/10" in result.output  # the bar grew by the three confirmation runs
    bad = CliRunner().invoke(app, [*args[:-1], "0"])
    assert bad.exit_code == 2 and "--confirm-seeds: --confirm-seeds 0 must be at least 1" in bad.output


def test_tune_refuses_an_unrelated_out_folder_before_anything_runs(tiny_model_dir, tmp_path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    args = ["tune", str(_config(tmp_path, tiny_model_dir)), "--budget", "40", "--out", str(precious)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "not a Tandem tune folder" in result.output, result.output
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]


def test_a_new_sweep_replaces_an_earlier_ones_runs_unless_resumed(tiny_model_dir, tmp_path) -> None:
    """Without --resume a sweep into an earlier sweep's folder removes that sweep's trial runs (an earlier
    candidate left beside the new ones would read as part of this sweep); files of the user's stay."""
    cfg, out = _config(tmp_path, tiny_model_dir), tmp_path / "tune"
    args = ["tune", str(cfg), "--budget", "6", "--min-steps", "1", "--out", str(out), "--no-confirm"]
    first = CliRunner().invoke(app, [*args, "--space", "trainer.lr=2e-3,3e-3"])
    assert first.exit_code == 0, first.output
    assert (out / "00001-3e-3" / "config.yaml").is_file()
    (out / "notes.txt").write_text("mine")
    (out / "00009-kept").mkdir()  # not a run folder
    resumed = CliRunner().invoke(app, [*args, "--resume", "--space", "trainer.lr=1e-3,2e-3"])
    assert resumed.exit_code == 0, resumed.output
    assert (out / "00001-3e-3").is_dir()  # --resume keeps what it may read back
    again = CliRunner().invoke(app, [*args, "--space", "trainer.lr=1e-3,2e-3"])
    assert again.exit_code == 0, again.output
    assert "replacing the earlier sweep" in again.output
    assert not (out / "00001-3e-3").exists() and (out / "00001-1e-3" / "config.yaml").is_file()
    assert (out / "notes.txt").read_text() == "mine" and (out / "00009-kept").is_dir()
