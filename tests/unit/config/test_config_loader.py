"""Config loading: YAML + dotted overrides -> validated TandemConfig, presets, cross-field checks, errors
that name the key and ``file:line``, the shipped configs, ``tandem config show`` and the generated docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.config import (
    ALGORITHM_PRESETS,
    TandemConfig,
    apply_overrides,
    build_config,
    config_to_yaml,
    load_config,
    parse_override,
)
from tandem.config.docs import config_reference
from tandem.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
# rm.yaml, dpo.yaml and rlaif_dpo.yaml configure `tandem rm|dpo|label` (tandem.config.rlhf), not RL runs;
# tests/unit/train/test_rm.py checks they load.
COMMAND_CONFIGS = {"rm.yaml", "dpo.yaml", "rlaif_dpo.yaml"}
SHIPPED = sorted(p for p in (REPO / "configs").glob("*.yaml") if p.name not in COMMAND_CONFIGS)

BASE = """\
run:
  name: t
model:
  path: models/tiny
data:
  task: arith
  prompts_per_step: 4
rollout:
  n: 4
algorithm:
  name: grpo
trainer:
  lr: 1.0e-3
"""


@pytest.fixture
def cfg_file(tmp_path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(BASE)
    return path


def _line_of(path: Path, text: str) -> int:
    return path.read_text().splitlines().index(text) + 1


def _error(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message
    return message


# -- overrides ---------------------------------------------------------------------------------------------


def test_overrides_set_nested_keys_with_yaml_types(cfg_file):
    cfg = load_config(
        cfg_file,
        [
            "trainer.lr=5e-4",
            "trainer.total_steps=7",
            "algorithm.kl.kind=k2",
            "algorithm.beta=0.05",
            "rollout.stop=[';', \"\\n\"]",  # double-quoted YAML reads the escape as a newline
            "data.task_options={digits: 3}",
            "monitor.tensorboard=false",
            "run.output_dir=/tmp/somewhere",
        ],
    )
    assert cfg.trainer.lr == pytest.approx(5e-4)
    assert cfg.trainer.total_steps == 7 and isinstance(cfg.trainer.total_steps, int)
    assert cfg.algorithm.kl.kind == "k2" and cfg.algorithm.beta == 0.05
    assert cfg.rollout.stop == [";", "\n"]
    assert cfg.data.task_options == {"digits": 3}
    assert cfg.monitor.tensorboard is False
    assert cfg.run.output_dir == "/tmp/somewhere"
    assert cfg.data.prompts_per_step == 4  # untouched keys keep the file's values


def test_overrides_create_missing_sections_and_replace_values():
    data = {"trainer": {"lr": 1.0}}
    apply_overrides(data, ["checkpoint.every=5", "trainer.lr=2", "a.b.c=x", "trainer.lr=3"])
    assert data == {"trainer": {"lr": 3}, "checkpoint": {"every": 5}, "a": {"b": {"c": "x"}}}


def test_numeric_override_parts_index_lists_as_in_hydra():
    data = {"reward": {"functions": [{"path": "a:f"}, {"path": "b:g", "weight": 1}]}}
    apply_overrides(data, ["reward.functions.1.weight=0.5", "reward.functions.-2.name=first"])
    assert data["reward"]["functions"] == [{"path": "a:f", "name": "first"}, {"path": "b:g", "weight": 0.5}]
    apply_overrides(data, ["reward.functions.0={path: c:h}"])
    assert data["reward"]["functions"][0] == {"path": "c:h"}


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("reward.functions.2.name=x", "'reward.functions' has 2 items, no index 2"),
        ("reward.functions.name=x", "'reward.functions' is a list; index it by number"),
        ("reward.functions.0.path.deep=x", "'path' is not a section"),
    ],
)
def test_bad_list_override_is_a_one_line_error(override, fragment):
    data = {"reward": {"functions": [{"path": "a:f"}, {"path": "b:g"}]}}
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        apply_overrides(data, [override])


def test_an_index_into_a_list_the_config_does_not_have_says_so():
    # no config key is a number: an index under a missing key means a list the config left empty
    with pytest.raises(ConfigError, match=re.escape("'reward.functions' has 0 items, no index 0")):
        apply_overrides({"reward": {}}, ["reward.functions.0.weight=2"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # the override is blamed, not the YAML line of the section its key lives in
        (
            "algorithm.name=grpoo",
            "override 'algorithm.name=grpoo': algorithm.name: unknown algorithm 'grpoo'",
        ),
        # list indexes stay in the key; a union member's type tag (list[str]) is not a key
        (
            "reward.functions.0.weight=abc",
            "override 'reward.functions.0.weight=abc': reward.functions.0.weight:",
        ),
        ("model.lora.target_modules=[1]", "model.lora.target_modules.0: Input should be a valid string"),
        (  # one name as a string: not a union's "valid list", but what the key takes
            "model.lora.target_modules=q_proj",
            "model.lora.target_modules: a list of module names ([q_proj] or [q_proj, v_proj]) or all-linear",
        ),
    ],
)
def test_validation_errors_name_the_override_and_the_indexed_key(tmp_path, override, message):
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {path: m}\ndata: {task: arith}\nalgorithm:\n  name: grpo\nreward:\n  functions:\n    - path: r.py:f\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, [override])
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a=1", 1),
        ("a=0.5", 0.5),
        ("a=true", True),
        ("a=null", None),
        ("a=", None),
        ("a=abc", "abc"),
        ("a='1'", "1"),
        ("a=[1, 2]", [1, 2]),
        ("a={x: 1}", {"x": 1}),
        ("a=b=c", "b=c"),  # only the first '=' splits
        (" a.b =2", 2),
    ],
)
def test_parse_override_values_are_yaml(text, value):
    _, parsed = parse_override(text)
    assert parsed == value and type(parsed) is type(value)


def test_parse_override_reads_exponent_without_dot_as_float():
    # YAML 1.1 reads '5e-6' (no dot) as a string; untyped dicts (task_options) would keep it.
    assert parse_override("trainer.lr=5e-6") == (["trainer", "lr"], 5e-6)
    assert parse_override("run.name=inf") == (["run", "name"], "inf")


@given(
    path=st.lists(st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True), min_size=1, max_size=4),
    value=st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=3)),
)
def test_override_round_trip(path, value):
    text = f"{'.'.join(path)}={yaml.safe_dump(value, default_flow_style=True).strip()}"
    parsed_path, parsed = parse_override(text)
    assert parsed_path == path and parsed == value and type(parsed) is type(value)
    node = apply_overrides({}, [text])
    for part in path:
        node = node[part]
    assert node == value


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("trainer.lr", "not KEY=VALUE"),
        ("=1", "empty key part"),
        ("trainer..lr=1", "empty key part"),
        ("trainer.=1", "empty key part"),
        ("trainer.lr.peak=1", "'lr' is not a section"),
    ],
)
def test_bad_override_is_a_one_line_error(cfg_file, override, fragment):
    assert fragment in _error(cfg_file, override)


# -- presets -----------------------------------------------------------------------------------------------


def test_preset_fills_unset_fields(cfg_file):
    a = load_config(cfg_file, ["algorithm.name=dapo"]).algorithm
    assert a.loss_options == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None}
    assert a.dynamic_sampling is True and a.aggregation == "token-mean" and a.advantage == "grpo"


def test_explicit_fields_win_over_the_preset(cfg_file):
    a = load_config(
        cfg_file, ["algorithm.name=dapo", "algorithm.clip_high=0.3", "algorithm.dynamic_sampling=false"]
    ).algorithm
    assert a.loss_options["clip_high"] == 0.3 and a.dynamic_sampling is False
    assert a.aggregation == "token-mean"  # the rest still comes from the preset


def test_explicit_field_in_file_wins(cfg_file):
    cfg_file.write_text(BASE.replace("  name: grpo\n", "  name: dapo\n  clip_high: 0.25\n"))
    assert load_config(cfg_file).algorithm.loss_options["clip_high"] == 0.25
    # An override of the name keeps the file's explicit clip_high.
    assert load_config(cfg_file, ["algorithm.name=rloo"]).algorithm.loss_options["clip_high"] == 0.25


@pytest.mark.parametrize("name", sorted(set(ALGORITHM_PRESETS) - {"custom"}))
def test_every_preset_resolves_to_its_fields(cfg_file, name):
    from tandem.algos import ADVANTAGE_ESTIMATORS

    spec = ADVANTAGE_ESTIMATORS.get(ALGORITHM_PRESETS[name]["advantage"])
    extra = ["critic.lr=1e-5"] if spec.needs_critic else []
    extra += ["algorithm.opd.teacher=models/teacher"] if "teacher_logprobs" in spec.requires else []
    a = load_config(cfg_file, [f"algorithm.name={name}", *extra]).algorithm
    for key, value in ALGORITHM_PRESETS[name].items():
        got = getattr(a, key)
        if isinstance(value, dict):  # a nested section or loss_options: the preset's keys are set
            got = {k: v for k, v in dict(got).items() if k in value}
        assert got == value, key


def test_unknown_algorithm_lists_the_presets(cfg_file):
    message = _error(cfg_file, "algorithm.name=ppo2")
    assert "unknown algorithm 'ppo2'" in message and "grpo" in message and "dapo" in message
    assert message.startswith("override 'algorithm.name=ppo2': algorithm.name:")  # the override set it
    cfg_file.write_text(cfg_file.read_text().replace("  name: grpo", "  name: ppo2"))  # the file set it
    assert f"{cfg_file}:{_line_of(cfg_file, '  name: ppo2')}: algorithm.name:" in _error(cfg_file)


def test_custom_requires_every_choice(cfg_file):
    message = _error(cfg_file, "algorithm.name=custom")
    assert "algorithm.advantage" in message and "valid:" in message


# -- cross-field checks ------------------------------------------------------------------------------------


def test_group_estimator_with_one_sample_names_rollout_n(cfg_file):
    message = _error(cfg_file, "rollout.n=1")  # the value in effect came from the command line
    assert message.startswith("override 'rollout.n=1': rollout.n:")
    assert _error(cfg_file, "rollout.n=1", "trainer.lr=0.1").startswith("override 'rollout.n=1'")
    cfg_file.write_text(BASE.replace("  n: 4", "  n: 1"))
    assert _error(cfg_file).startswith(f"{cfg_file}:{_line_of(cfg_file, '  n: 1')}: rollout.n:")
    assert "rollout.n >= 2" in message


def test_mini_batch_must_divide_the_batch(cfg_file):
    message = _error(cfg_file, "trainer.mini_batch_size=5")
    assert "trainer.mini_batch_size" in message and "does not divide the batch of 16" in message
    assert message.startswith("override 'trainer.mini_batch_size=5': ")


def test_micro_batch_must_divide_the_mini_batch(cfg_file):
    message = _error(cfg_file, "trainer.mini_batch_size=8", "trainer.micro_batch_size=3")
    assert "trainer.micro_batch_size" in message and "mini-batch of 8" in message


def test_valid_batch_split_loads(cfg_file):
    cfg = load_config(cfg_file, ["trainer.mini_batch_size=8", "trainer.micro_batch_size=4"])
    assert cfg.samples_per_step == 16


def test_no_prompts_names_data_task(cfg_file):
    assert "data.task" in _error(cfg_file, "data.task=null")


def test_file_data_needs_reward_functions(cfg_file):
    message = _error(cfg_file, "data.task=null", "data.train_file=p.jsonl")
    assert "reward.functions" in message


def test_kl_in_reward_needs_a_token_reward_estimator(cfg_file):
    message = _error(cfg_file, "algorithm.beta=0.1", "algorithm.kl.where=reward")
    assert "algorithm.kl.where" in message


# -- extra="forbid" and file:line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("insert_after", "line", "key", "hint"),
    [
        ("  prompts_per_step: 4", "  shuffle: true", "data.shuffle", ""),
        ("trainer:", "  learning_rate: 0.1", "trainer.learning_rate", ""),
        ("  name: grpo", "  kl: {kind: k3, wher: loss}", "algorithm.kl.wher", " (did you mean 'where'?)"),
        ("run:", "  nme: x", "run.nme", " (did you mean 'name'?)"),
    ],
)
def test_unknown_key_names_file_line_and_key(cfg_file, insert_after, line, key, hint):
    lines = BASE.splitlines()
    lines.insert(lines.index(insert_after) + 1, line)
    cfg_file.write_text("\n".join(lines) + "\n")
    message = _error(cfg_file)
    assert message == f"{cfg_file}:{_line_of(cfg_file, line)}: {key}: unknown key{hint}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.lrr=1", "override 'trainer.lrr=1': trainer.lrr: unknown key (did you mean 'lr'?)"),
        ("traner.lr=1", "override 'traner.lr=1': traner: unknown key (did you mean 'trainer'?)"),
        ("critic={lrr: 1}", "override 'critic={lrr: 1}': critic.lrr: unknown key (did you mean 'lr'?)"),
        ("trainer.zzz=1", "override 'trainer.zzz=1': trainer.zzz: unknown key"),
    ],
)
def test_unknown_key_from_an_override_names_the_override_and_a_close_key(cfg_file, override, message):
    assert _error(cfg_file, override) == message


def test_unknown_top_level_section(cfg_file):
    cfg_file.write_text(BASE + "optimiser:\n  lr: 1\n")
    assert _error(cfg_file) == f"{cfg_file}:{_line_of(cfg_file, 'optimiser:')}: optimiser: unknown key"


def test_unknown_key_from_an_override_is_named(cfg_file):
    assert "data.shuffle: unknown key" in _error(cfg_file, "data.shuffle=true")


def test_bad_value_names_its_line(cfg_file):
    message = _error(cfg_file, "rollout.temperature=-1")
    assert "rollout.temperature" in message
    cfg_file.write_text(BASE.replace("  lr: 1.0e-3", "  lr: fast"))
    message = _error(cfg_file)
    assert message.startswith(f"{cfg_file}:{_line_of(cfg_file, '  lr: fast')}: trainer.lr:")


def test_missing_model_section(cfg_file):
    cfg_file.write_text(BASE.replace("model:\n  path: models/tiny\n", ""))
    assert "model: Field required" in _error(cfg_file)


def test_invalid_yaml_names_file_and_line(cfg_file):
    cfg_file.write_text(BASE.replace("  n: 4", "  n: [4"))
    message = _error(cfg_file)
    assert "invalid YAML" in message
    reported = int(message.split(f"{cfg_file}:")[1].split(":")[0])
    assert _line_of(cfg_file, "  n: [4") <= reported <= _line_of(cfg_file, "  n: [4") + 1


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n"])
def test_top_level_must_be_a_mapping(cfg_file, text):
    cfg_file.write_text(text)
    assert "top level must be a mapping" in _error(cfg_file)


def test_missing_file(tmp_path):
    assert "not found" in _error(tmp_path / "nope.yaml")


# -- shipped configs, resolved YAML, docs ------------------------------------------------------------------


def test_configs_are_shipped():
    names = {p.name for p in SHIPPED}
    assert {"quickstart.yaml", "grpo.yaml", "dapo.yaml", "rloo.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_round_trips(path):
    cfg = load_config(path)
    assert isinstance(cfg, TandemConfig)
    assert cfg.algorithm.name in ALGORITHM_PRESETS
    again = build_config(yaml.safe_load(config_to_yaml(cfg)))
    assert again == cfg


def test_quickstart_accepts_the_documented_overrides(tmp_path):
    cfg = load_config(
        REPO / "configs" / "quickstart.yaml", ["trainer.total_steps=3", f"run.output_dir={tmp_path}"]
    )
    assert cfg.trainer.total_steps == 3 and cfg.run.output_dir == str(tmp_path)


def test_config_show_prints_the_resolved_yaml(cfg_file):
    result = CliRunner().invoke(
        app, ["config", "show", str(cfg_file), "algorithm.name=dapo", "reward.format_regex=[a-z]+ [/0-9]*"]
    )
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    expected = load_config(cfg_file, ["algorithm.name=dapo", "reward.format_regex=[a-z]+ [/0-9]*"])
    assert shown == expected.model_dump(mode="json")
    assert shown["algorithm"]["loss_options"]["clip_high"] == 0.28  # the preset is expanded
    assert shown["reward"]["format_regex"] == "[a-z]+ [/0-9]*"  # printed verbatim, not as rich markup
    assert build_config(shown) == expected


def test_config_show_bad_input_is_one_line(cfg_file):
    result = CliRunner().invoke(app, ["config", "show", str(cfg_file), "rollout.n=1"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "rollout.n" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("name", "command"), [("dpo.yaml", "dpo"), ("rm.yaml", "rm"), ("rlaif_dpo.yaml", "label")]
)
def test_config_show_resolves_the_rlhf_command_configs(name, command):
    from tandem.config.rlhf import DPOConfig, LabelConfig, RMConfig, load_command_config

    path = REPO / "configs" / name
    plain = CliRunner().invoke(app, ["config", "show", str(path)])  # read as a train config: said so
    assert plain.exit_code == 2 and "a tandem rm, dpo or label config" in plain.stderr
    assert "--command rm|dpo|label" in plain.stderr and plain.stderr.count("\n") == 1
    result = CliRunner().invoke(app, ["config", "show", str(path), "--command", command])
    assert result.exit_code == 0, result.output
    cls = {"dpo": DPOConfig, "rm": RMConfig, "label": LabelConfig}[command]
    assert yaml.safe_load(result.stdout) == load_command_config(cls, path).model_dump(mode="json")


def test_docs_configs_md_is_the_generated_reference():
    """docs/configs.md is generated (`tandem config docs > docs/configs.md`); it must not go stale."""
    result = CliRunner().invoke(app, ["config", "docs"])
    assert result.exit_code == 0
    assert (REPO / "docs" / "configs.md").read_text() == result.stdout


def test_config_docs_command_prints_the_reference_and_every_channel_option():
    from tandem.channels import BACKENDS, channel_class

    result = CliRunner().invoke(app, ["config", "docs"])
    schema, _, rest = config_reference().partition("## `monitor`")
    assert result.stdout.startswith(schema) and result.stdout.endswith("## `monitor`" + rest + "\n")
    for name in BACKENDS:
        for key, field in channel_class(name).Options.model_fields.items():
            assert f"| `{name}` | `{key}` |" in result.stdout and field.description in result.stdout


def test_every_field_is_documented():
    reference = config_reference()

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")
                continue
            assert field.description, f"{prefix}{name} has no description"
            assert f"`{prefix}{name}`" in reference

    walk(TandemConfig, "")
