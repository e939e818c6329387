"""vLLM rollout backend (``rollout.backend: vllm``): vLLM's scheduler, paged KV cache and kernels.

The engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here unless the caller set
it): weight updates then hand tensors to vLLM's worker without serialising them, and no entry-point guard
is needed. It loads its own copy of the model from ``EngineSpec.path`` (vLLM cannot sample with a torch
module it did not build); when the caller also passes ``EngineSpec.model`` (a colocated trainer's policy),
that module's weights are loaded at once and again at every ``update_weights``, so the engine always
samples with the trainer's current weights.

- **Prompts** are encoded by Tandem's tokenizer (:func:`~tandem.rollout.prompts.encode_prompts`) and given
  to vLLM as token ids, so both engines see the same tokens; completions are decoded and stop strings cut
  by the shared :mod:`~tandem.rollout.assemble`.
- **Behaviour log-probs** come from vLLM's sampler in ``processed_logprobs`` mode: the sampled token's
  log-prob under ``log_softmax(logits / temperature)``, raw logits when greedy — Tandem's convention.
  With ``top_k``/``top_p`` set, vLLM's log-probs are of the *truncated* distribution (what it sampled
  from); the trainer recomputes untruncated ones, and ``rollout/logprob_diff_*`` shows the difference.
- **Weight updates** go through vLLM's in-place ``reload_weights`` (its own checkpoint-format loader,
  which handles tied embeddings, fused QKV / gate-up projections and the CPU backend's repacked
  weights). The prefix cache is reset afterwards (cached KV of the old weights must not be reused). On
  CUDA with ``sleep_during_update`` the KV cache is freed (``sleep``) during the load and re-allocated
  after (``wake_up``), so trainer and engine can share one GPU.
- **In-flight updates**: :meth:`generate` drives vLLM's engine step by step; ``on_chunk`` runs every
  ``chunk_tokens`` steps (one token per running request each) and may call :meth:`update_weights`. The
  running requests keep their KV cache and continue with the new weights, as in PipelineRL.
- **Seeds**: every sampled request gets an explicit seed — derived from ``SamplingParams.seed`` and the
  prompt index, or drawn from the global torch RNG when ``seed is None`` — so a run seeded with
  ``torch.manual_seed`` is reproducible and prompts never share a random stream.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import re
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from tandem.errors import ConfigError, DataError, ModelError
from tandem.models import load_tokenizer
from tandem.models.lora import publishable_state_dict
from tandem.rollout.assemble import assemble_batch, completion_texts
from tandem.rollout.base import ChunkCallback, EngineSpec, SamplingParams
from tandem.rollout.prompts import encode_prompts, left_pad
from tandem.rollout.registry import parse_engine_options
from tandem.rollout.rows import per_prompt
from tandem.rollout.stops import StopStrings
from tandem.rollout.vllm_requests import VLLMOptions, seeds_for, vllm_params
from tandem.types import RolloutBatch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine (see the docstring)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's INFO lines drown Tandem's progress

try:
    import vllm
except ModuleNotFoundError:
    raise  # the registry turns a missing ``vllm`` into a line naming the extra
except (ImportError, OSError, RuntimeError) as err:  # e.g. torchvision built for another torch
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    raise ConfigError(
        f"vllm is installed but fails to import: {first}",
        where="rollout.backend",
        hint="on a CPU torch remove the mismatched vision/audio wheels: "
        "pip uninstall -y torchvision torchaudio torchcodec (make vllm does this)",
    ) from None

# Every in-place reload warns "RotaryEmbedding: Failed to load weights": the rotary cos/sin cache is not
# in any checkpoint (it is computed from the config), so vLLM keeps the one it has, which is right.
logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)


def _reason(err: BaseException) -> str:
    """The line of a vLLM start-up error that says what is wrong: pydantic's first line only counts the
    errors ("1 validation error for ModelConfig"), the reason follows it."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    lines = [line for line in lines if not re.match(r"\d+ validation errors? for ", line)]
    reason = lines[0] if lines else type(err).__name__
    return reason.removeprefix("Value error, ").split(" [type=")[0]


class VLLMEngine:
    """A :class:`~tandem.rollout.base.RolloutEngine` over an in-process ``vllm.LLM`` (see the module
    docstring). ``source`` is the module whose weights the engine mirrors (a colocated trainer's policy),
    or ``None`` (the engine only changes weights through :meth:`update_weights` state dicts)."""

    truncated_logprobs = True  # with top_k / top_p, behaviour log-probs are of the truncated distribution
    scores_only_at_temperature = 1.0  # score(): vLLM's prompt log-probs ignore the temperature
    max_temperature = 2.0  # vLLM refuses hotter sampling (checked before a run starts its engine)

    def __init__(
        self,
        path: str,
        tokenizer: Any,
        options: VLLMOptions,
        *,
        dtype: str | None = None,
        max_prompt_len: int | None = None,
        add_special_tokens: bool = True,
        version: int = 0,
        source: torch.nn.Module | None = None,
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ModelError("tokenizer has no pad token", hint="load it with tandem.models.load_tokenizer")
        self.path, self.tokenizer, self.options = path, tokenizer, options
        self.max_prompt_len, self.add_special_tokens = max_prompt_len, add_special_tokens
        self.source = source
        self.cuda = torch.cuda.is_available()
        self._version = int(version)
        self._stops: dict[tuple[str, ...], StopStrings] = {}
        self.last_sync: dict[str, float] = {}  # seconds and bytes of the last weight update
        # the prefix cache still holds KV computed with older weights: vLLM refuses to reset it while
        # requests run (an update in flight); reset before any new request reads it
        self._stale_prefix_cache = False
        self._threads = torch.get_num_threads()  # vLLM's own count, set by _start (see _vllm_threads)
        self.llm = self._start(dtype)
        self._eos_ids = _eos_ids(self.llm, tokenizer)
        if source is not None:
            self._load(publishable_state_dict(source))  # a LoRA policy: merged, under the base's names

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> VLLMEngine:
        """The registry's constructor: loads ``spec.path`` (required: vLLM builds its own model) and, when
        ``spec.model`` is given, mirrors that module's weights; ``spec.options`` are :class:`VLLMOptions`."""
        opts = parse_engine_options(VLLMOptions, spec.options, where="rollout.engine_options")
        if spec.path is None:
            raise ModelError(
                "the vllm engine loads its own copy of the model and needs its folder (EngineSpec.path)",
                where="rollout.backend",
            )
        tokenizer = spec.tokenizer if spec.tokenizer is not None else load_tokenizer(spec.path)
        return cls(
            spec.path,
            tokenizer,
            opts,
            dtype=spec.dtype,
            max_prompt_len=spec.max_prompt_len,
            add_special_tokens=spec.add_special_tokens,
            version=spec.version,
            source=spec.model,
        )

    def _start(self, dtype: str | None) -> vllm.LLM:
        """Build the in-process ``vllm.LLM``; torch's thread count is restored afterwards (vLLM lowers it
        for serving, which would slow a trainer sharing the process)."""
        o = self.options
        kwargs: dict[str, Any] = {
            "model": self.path,
            "dtype": dtype or "float32",  # as the HF engine and the trainer
            "seed": o.seed,
            "enforce_eager": o.enforce_eager,
            "enable_prefix_caching": o.enable_prefix_caching,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # ignore generation_config.json defaults: Tandem passes every knob
            "tensor_parallel_size": o.tensor_parallel_size,
        }
        if o.max_model_len is not None:
            kwargs["max_model_len"] = o.max_model_len
        if self.cuda:
            kwargs["gpu_memory_utilization"] = o.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = o.sleep_during_update
        if o.kv_cache_gb is not None or not self.cuda:
            kwargs["kv_cache_memory_bytes"] = int((o.kv_cache_gb or 1.0) * 2**30)
        if not self.cuda:
            _check_cpu_head_size(self.path)
        threads = torch.get_num_threads()
        # vLLM seeds the global RNGs of the process it runs in; a trainer sharing the process keeps its own.
        rng = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
        cuda_rng = torch.cuda.get_rng_state_all() if self.cuda else None
        # An earlier in-process engine dropped without close() shuts down from a finalizer, and vLLM's
        # shutdown tears down the process-wide parallel groups: collect it now, before this engine creates
        # them, not under it later (vLLM also gc.freeze()s objects at start-up, hence the unfreeze).
        gc.unfreeze()
        gc.collect()
        try:
            with _context_proxies_parked():
                llm = vllm.LLM(**kwargs)
            self._threads = torch.get_num_threads()
            return llm
        except (ValueError, RuntimeError, OSError, AssertionError) as err:  # AssertionError: e.g. TP on CPU
            raise ModelError(
                f"vLLM could not load {self.path}: {_reason(err)}",
                where="rollout.backend",
                hint="check the model folder and rollout.engine_options",
            ) from None
        finally:
            torch._C.set_num_threads(threads)  # vLLM made torch.set_num_threads a no-op on CPU
            random.setstate(rng[0])
            np.random.set_state(rng[1])
            torch.random.set_rng_state(rng[2])
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    @property
    def version(self) -> int:
        """Weight version the engine currently samples with."""
        return self._version

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None, version: int) -> None:
        """Load ``state_dict`` (or, for ``None``, the mirrored ``source`` module's weights) into vLLM's
        model, reset the prefix cache, record ``version``; ``last_sync`` gets the seconds and bytes."""
        if self.llm is None:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        weights = (
            state_dict
            if state_dict is not None
            else (publishable_state_dict(self.source) if self.source else None)
        )
        if weights is not None:
            self._load(weights)
        self._version = int(version)

    def _load(self, state_dict: dict[str, torch.Tensor]) -> None:
        t0 = time.perf_counter()
        named = [(k, v.detach()) for k, v in state_dict.items() if not _skipped(k)]
        sleep = self.cuda and self.options.sleep_during_update
        if sleep:
            self.llm.sleep(level=1)  # offload weights, drop the KV cache
            self.llm.wake_up(tags=["weights"])
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named)})
        except (ValueError, KeyError, RuntimeError, AssertionError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelError(f"weights do not match the vLLM model: {first}") from err
        finally:
            if sleep:
                self.llm.wake_up(tags=["kv_cache"])
        self._stale_prefix_cache = self.llm.reset_prefix_cache() is False
        self.last_sync = {
            "seconds": time.perf_counter() - t0,
            "bytes": float(sum(v.numel() * v.element_size() for _, v in named)),
        }

    def close(self) -> None:
        """Shut vLLM's engine down and free its memory (idempotent)."""
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()

    def _stop_strings(self, stop: list[str]) -> StopStrings | None:
        if not stop:
            return None
        key = tuple(stop)
        if key not in self._stops:
            self._stops[key] = StopStrings(self.tokenizer, list(stop))
        return self._stops[key]

    def generate(
        self,
        prompts: list[str],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
        on_chunk: ChunkCallback | None = None,
        chunk_tokens: int = 4,
    ) -> RolloutBatch:
        """Sample responses; see :class:`~tandem.rollout.base.RolloutEngine` for the row layout and the
        module docstring for seeds and in-flight updates."""
        if self.llm is None:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        if extras is not None and len(extras) != len(prompts):
            raise DataError(f"got {len(extras)} extras rows for {len(prompts)} prompts", where="extras")
        encoded = encode_prompts(
            self.tokenizer,
            prompts,
            add_special_tokens=self.add_special_tokens,
            max_prompt_len=self.max_prompt_len,
        )
        return self._generate_encoded(prompts, encoded, params, group_offset, extras, on_chunk, chunk_tokens)

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
    ) -> RolloutBatch:
        """:meth:`generate` from token ids, used as they are (no tokenisation, no length limit): the
        continuation of a multi-turn episode whose history must stay token-exact."""
        if self.llm is None:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        if not prompt_ids or any(not ids for ids in prompt_ids):
            raise DataError("generate_ids needs non-empty token-id prompts", where="prompt_ids")
        encoded = [list(p) for p in prompt_ids]
        texts = self.tokenizer.batch_decode(encoded, skip_special_tokens=False)
        return self._generate_encoded(texts, encoded, params, group_offset, extras, None, 4)

    def _generate_encoded(
        self,
        prompts: list[str],
        encoded: list[list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        group_offset: int,
        extras: list[dict] | None,
        on_chunk: ChunkCallback | None,
        chunk_tokens: int,
    ) -> RolloutBatch:
        """The body of :meth:`generate` after the prompts are encoded."""
        each = per_prompt(params, len(prompts))
        self._check_context(encoded, each)
        seeds = seeds_for(params, each)
        start_version = self._version
        # vLLM refuses n > 1 when greedy: such a prompt becomes n identical one-sample requests.
        requests = [
            (i, vllm_params(p, seed, self._eos_ids, n=1 if p.greedy else p.n))
            for i, (p, seed) in enumerate(zip(each, seeds, strict=True))
            for _ in range(p.n if p.greedy else 1)
        ]
        with _vllm_threads(None if self.cuda else self._threads):
            samples = self._run(encoded, requests, on_chunk, max(1, int(chunk_tokens)))
        return self._to_batch(prompts, encoded, each, samples, group_offset, extras, start_version)

    @property
    def max_model_len(self) -> int:
        """The longest prompt + response vLLM holds (``max_model_len``, or the model's position limit)."""
        return int(self.llm.llm_engine.model_config.max_model_len)

    def _check_context(self, encoded: list[list[int]], each: list[SamplingParams]) -> None:
        """Refuse prompts whose prompt + ``max_new_tokens`` exceeds ``max_model_len``: vLLM raises a
        validation error for a prompt past it and silently cuts responses that reach it (marked "length",
        as a response that used its budget) — the HF engine would have sampled them in full."""
        limit = self.max_model_len
        for i, (ids, p) in enumerate(zip(encoded, each, strict=True)):
            if len(ids) + p.max_new_tokens > limit:
                raise ConfigError(
                    f"prompt {i} has {len(ids)} tokens and max_new_tokens is {p.max_new_tokens}: "
                    f"{len(ids) + p.max_new_tokens} > vLLM's max_model_len {limit}",
                    where="rollout.engine_options.max_model_len",
                    hint="raise max_model_len (up to the model's max_position_embeddings), or lower "
                    "data.max_prompt_len / rollout.max_new_tokens",
                )

    def _run(
        self,
        encoded: list[list[int]],
        requests: list[tuple[int, vllm.SamplingParams]],  # (prompt index, parameters)
        on_chunk: ChunkCallback | None,
        chunk_tokens: int,
    ) -> list[Any]:
        """Drive vLLM's engine until every request finished; the ``CompletionOutput`` rows of all prompts,
        a prompt's samples consecutive, prompts in order."""
        done = self._drive(encoded, requests, on_chunk, chunk_tokens)
        return [c for out in done for c in sorted(out.outputs, key=lambda c: c.index)]

    def _drive(
        self,
        encoded: list[list[int]],
        requests: list[tuple[int, vllm.SamplingParams]],  # (prompt index, parameters)
        on_chunk: ChunkCallback | None = None,
        chunk_tokens: int = 4,
    ) -> list[Any]:
        """The finished ``RequestOutput`` of every request, in request order."""
        if self._stale_prefix_cache:  # no request runs now: the reset refused in flight must go through
            if self.llm.reset_prefix_cache() is False:
                raise ModelError(
                    "vLLM refused to reset its prefix cache after a weight update: new requests would "
                    "reuse KV computed with the old weights"
                )
            self._stale_prefix_cache = False
        engine = self.llm.llm_engine
        tag = uuid.uuid4().hex[:8]
        inputs = self.llm.renderer.render_cmpl([{"prompt_token_ids": ids} for ids in encoded])
        order: dict[str, int] = {}
        for k, (i, p) in enumerate(requests):
            rid = f"tandem-{tag}-{k}"  # outputs carry this id (vLLM adds a suffix internally)
            engine.add_request(rid, inputs[i], p)
            order[rid] = k
        done: list[Any] = [None] * len(requests)
        steps = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id in order:
                    done[order[out.request_id]] = out
            steps += 1
            if on_chunk is not None and steps % chunk_tokens == 0 and engine.has_unfinished_requests():
                on_chunk()  # may call update_weights: running requests continue with the new weights
        if any(o is None for o in done):
            k = done.index(None)
            raise ModelError(f"vLLM returned no output for prompt {requests[k][0]}", where="prompts")
        return done

    def score(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        response_ids: torch.Tensor,  # [B, R] long, right padded
        response_mask: torch.Tensor,  # [B, R] bool
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Teacher-forced log-probs (:class:`~tandem.rollout.base.ScoresCompletions`): vLLM's prompt log-probs
        of prompt + response, ``[B, R]`` float32, 0 on padding; from the raw logits, so temperature 1 only."""
        if self.llm is None:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        if temperature != 1.0:
            raise ConfigError(
                f"the vllm engine scores given completions at temperature 1 only (got {temperature})",
                where="rollout.temperature",
                hint="use rollout.temperature=1 (no adaptive temperature), or rollout.backend=hf",
            )
        B, R = response_ids.shape
        pairs = zip(prompt_ids, prompt_mask, response_ids, response_mask, strict=True)
        rows = [(p[m].tolist(), r[k].tolist()) for p, m, r, k in pairs]  # unpadded prompt, response
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        with _vllm_threads(None if self.cuda else self._threads):
            done = self._drive([p + r for p, r in rows], [(i, params) for i in range(B)])
        out = torch.zeros((B, R), dtype=torch.float32)
        for i, (o, (p, r)) in enumerate(zip(done, rows, strict=True)):
            for t, tok in enumerate(r):  # position len(p) + t holds the log-prob of response token t
                out[i, t] = o.prompt_logprobs[len(p) + t][tok].logprob
        return out

    def _to_batch(
        self,
        prompts: list[str],
        encoded: list[list[int]],
        each: list[SamplingParams],
        samples: list[Any],  # [B] vLLM CompletionOutputs
        group_offset: int,
        extras: list[dict] | None,
        version: int,
    ) -> RolloutBatch:
        counts = [p.n for p in each]
        rows = [list(c.token_ids) for c in samples]
        R = max(1, max(len(r) for r in rows))
        B, pad = len(rows), self.tokenizer.pad_token_id
        tokens = torch.full((B, R), pad, dtype=torch.long)  # [B, R]
        logprobs = torch.zeros((B, R), dtype=torch.float32)  # [B, R]
        for b, (row, c) in enumerate(zip(rows, samples, strict=True)):
            if row:
                tokens[b, : len(row)] = torch.tensor(row, dtype=torch.long)
                logprobs[b, : len(row)] = torch.tensor(
                    [entry[tok].logprob for tok, entry in zip(row, c.logprobs, strict=True)]
                )
        prompt_ids, prompt_mask = left_pad(encoded, pad)  # [N, P]
        index = torch.tensor([i for i, n in enumerate(counts) for _ in range(n)])
        cut = [self._stop_strings(p.stop) for p in each for _ in range(p.n)]
        return assemble_batch(
            prompts=prompts,
            counts=counts,
            prompt_ids=prompt_ids[index],
            prompt_mask=prompt_mask[index],
            tokens=tokens,
            logprobs=logprobs,
            lengths=torch.tensor([len(r) for r in rows], dtype=torch.long),
            stopped=[c.finish_reason == "stop" for c in samples],
            texts=completion_texts(self.tokenizer, rows, cut),
            group_offset=group_offset,
            extras=extras,
            version=version,
        )


class _Parked:
    """Stands in for a context-bound proxy while vLLM starts: falsy, with an ordinary ``__dict__``."""

    def __bool__(self) -> bool:
        return False


_PARKED = _Parked()


@contextmanager
def _context_proxies_parked() -> Iterator[None]:
    """Take context-bound proxies out of module namespaces while vLLM starts, then put them back.

    On CPU, vLLM 0.32 rebinds its Triton kernel overrides by scanning every module's globals with
    ``hasattr(value, "__dict__")``. A proxy bound to a context (Flask's ``request``/``g``/``current_app``,
    any werkzeug ``LocalProxy``) raises ``RuntimeError`` there outside its context, which aborts ``LLM()``
    with "Working outside of application context" in any process that imported Flask (e.g. through moto
    or locust). Values whose ``hasattr`` raises are swapped for a falsy placeholder for the duration of the
    start (falsy like an unbound proxy, so e.g. Flask's logging handler still falls back to stderr).
    """
    parked: list[tuple[dict, str, Any]] = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            try:
                hasattr(value, "__dict__")
            except Exception:  # noqa: BLE001 - exactly the values vLLM's scan would trip on
                parked.append((namespace, attr, value))
                namespace[attr] = _PARKED
    try:
        yield
    finally:
        for namespace, attr, value in parked:
            namespace[attr] = value


@contextmanager
def _vllm_threads(n: int | None) -> Iterator[None]:
    """Run vLLM's steps with the thread count it set up (``n``; None: leave it) and give the caller's back.

    vLLM's CPU attention fails a step whose kernels run with another OpenMP thread count than the one its
    plan was made with — a request from a server's worker thread (which starts at the process default)
    or from a trainer that restored its own count. ``torch._C``'s setter: once vLLM binds threads it
    replaces ``torch.set_num_threads`` with a no-op."""
    before = torch.get_num_threads()
    if n is not None and before != n:
        torch._C.set_num_threads(n)
    try:
        yield
    finally:
        if n is not None and before != n:
            torch._C.set_num_threads(before)


def _check_cpu_head_size(path: str) -> None:
    """vLLM's CPU attention kernels exist for some head sizes only; a model with another one would fail
    deep inside the first forward, so refuse it here with the sizes that work."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):  # another vLLM layout: let vLLM decide
        return
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in supported:
        raise ModelError(
            f"vLLM's CPU attention does not support head size {head} (model {path})",
            where="rollout.backend",
            hint=f"supported head sizes: {', '.join(map(str, supported))}; or use rollout.backend=hf",
        )


def _skipped(name: str) -> bool:
    """State-dict entries vLLM's loader does not take: rotary caches and other non-parameter buffers."""
    return name.endswith(("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached"))


def _eos_ids(llm: vllm.LLM, tokenizer: Any) -> list[int]:
    """Token ids that end a response: the tokenizer's EOS plus any in the model's generation config (the
    same set the HF engine stops on)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    extra = llm.llm_engine.model_config.hf_config.eos_token_id
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(i) for i in extra)
    try:
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(llm.llm_engine.model_config.model)
        extra = gen.eos_token_id
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, (list, tuple)):
            ids.update(int(i) for i in extra)
    except OSError:
        pass  # no generation_config.json
    if not ids:
        raise ModelError("neither the tokenizer nor the model config defines an EOS token")
    return sorted(ids)
