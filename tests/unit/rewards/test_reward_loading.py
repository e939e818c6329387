"""load_callable: dotted module paths, file paths, and a ConfigError for every way a spec can be wrong."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from tandem.errors import ConfigError
from tandem.rewards.loading import callable_origin, load_callable
from tandem.rewards.tasks.countdown import is_solution


def write(tmp_path, name: str, body: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_loads_dotted_module_function():
    assert load_callable("tandem.rewards.tasks.countdown:is_solution") is is_solution


def test_loads_dotted_attribute():
    fn = load_callable("tandem.rewards.tasks.arith:ArithTask.sample_row")
    assert fn.__qualname__ == "ArithTask.sample_row"


def test_loads_file_relative_to_base_dir_and_caches_module(tmp_path):
    write(
        tmp_path,
        "my_reward.py",
        "CALLS = []\ndef f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n",
    )
    fn = load_callable("my_reward.py:f", base_dir=tmp_path)
    assert fn(["p"], ["c"]) == [1.0]
    assert load_callable(f"{tmp_path}/my_reward.py:f") is fn
    assert callable_origin(fn).endswith(":f") and "my_reward" in callable_origin(fn)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tandem.rewards.tasks.countdown", "has no ':'"),
        ("tandem.rewards.tasks.countdown:", "is malformed"),
        (":is_solution", "is malformed"),
        ("tandem.rewards.tasks.countdown:is-solution", "is malformed"),
        ("tandem.no_such_module:f", "module 'tandem.no_such_module' not found"),
        ("not a module:f", "is not a module name"),
        ("tandem.rewards.tasks.countdown:missing", "has no attribute 'missing'"),
        ("tandem.rewards.expr:MAX_EXPRESSION_CHARS", "is not callable (it is int)"),
    ],
)
def test_bad_specs_raise_config_error_naming_key(spec, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_callable(spec, key="reward.functions[0]")
    assert str(info.value).startswith("reward.functions[0]: ")
    assert "\n" not in str(info.value)


def test_missing_attribute_lists_callables(tmp_path):
    (tmp_path / "mine.py").write_text("import os\nLIMIT = 3\nclass Judge: ...\ndef score(c): return 1.0\n")
    with pytest.raises(ConfigError, match=r"\(callables there: Judge, score\)$"):
        load_callable("mine.py:nope", base_dir=tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"file '.*nope\.py' not found"):
        load_callable("nope.py:f", base_dir=tmp_path)


def test_file_that_raises_on_import_names_its_line(tmp_path):
    path = write(tmp_path, "broken.py", "x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2: ") + r".*raised RuntimeError: boom"):
        load_callable(f"{path}:f")


def test_file_with_syntax_error_names_its_line(tmp_path):
    path = write(tmp_path, "bad_syntax.py", "def f(:\n    pass\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:1: ") + r".*SyntaxError"):
        load_callable(f"{path}:f")


def test_module_whose_own_import_fails(tmp_path, monkeypatch):
    write(tmp_path, "needs_dep.py", "import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"importing 'needs_dep' failed: No module named 'no_such_dependency_xyz'"
    ):
        load_callable("needs_dep:f")


def test_a_module_in_the_working_directory_is_found_as_python_finds_one(tmp_path, monkeypatch):
    # a console script's sys.path starts at its own folder, not the working directory
    (tmp_path / "cwd_rewards_mod.py").write_text(
        "def correct(completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_rewards_mod", raising=False)
    fn = load_callable("cwd_rewards_mod:correct")
    assert fn(completions=["a", "b"]) == [1.0, 1.0]
    with pytest.raises(ConfigError, match="module 'cwd_missing_mod' not found"):
        load_callable("cwd_missing_mod:correct")  # nothing of that name there: the error as before
    monkeypatch.delitem(sys.modules, "cwd_rewards_mod", raising=False)
