"""What Tandem asks of vLLM: the engine's options (``rollout.engine_options``), each request's sampling
parameters in vLLM's terms, and one seed per prompt.

Imported by :mod:`tandem.rollout.vllm_engine` only (``vllm`` is imported here at the top: the engine module
is itself imported lazily, through the registry).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import vllm
from pydantic import BaseModel, ConfigDict, Field
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind

from tandem.errors import ConfigError
from tandem.rollout.base import SamplingParams

SEED_MOD = 2**31 - 1


class VLLMOptions(BaseModel):
    """``rollout.engine_options`` of the ``vllm`` engine."""

    model_config = ConfigDict(extra="forbid")
    max_model_len: int | None = Field(
        None, ge=8, description="Longest prompt + response; None: the model's max_position_embeddings."
    )
    kv_cache_gb: float | None = Field(
        None, gt=0, description="KV cache size in GiB; None: 1 GiB on CPU, gpu_memory_utilization on CUDA."
    )
    gpu_memory_utilization: float = Field(
        0.4, gt=0, le=1, description="CUDA: share of GPU memory vLLM may take (the trainer needs the rest)."
    )
    enforce_eager: bool = Field(
        True, description="No CUDA graphs / torch.compile: fast start, slower decode."
    )
    enable_prefix_caching: bool = Field(True, description="Share the KV cache of a prompt's n samples.")
    sleep_during_update: bool = Field(
        True, description="CUDA: free the KV cache while weights load (vLLM sleep mode); ignored on CPU."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (CUDA).")
    seed: int = Field(0, description="vLLM's own seed (every Tandem request carries its own seed anyway).")


def vllm_params(p: SamplingParams, seed: int | None, eos_ids: list[int], *, n: int) -> vllm.SamplingParams:
    """vLLM's sampling parameters for Tandem's ``p`` (one request of ``n`` samples); a value vLLM refuses
    (e.g. temperature above 2) is a ConfigError naming the parameter."""
    try:
        return _build_params(p, seed, eos_ids, n)
    except (ValueError, VLLMValidationError) as err:
        key = getattr(err, "parameter", None) or "sampling"
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"vLLM refuses this value: {first}", where=f"rollout.{key}") from None


def _build_params(p: SamplingParams, seed: int | None, eos_ids: list[int], n: int) -> vllm.SamplingParams:
    return vllm.SamplingParams(
        n=n,
        max_tokens=p.max_new_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        seed=None if p.greedy else seed,
        stop=list(p.stop) or None,
        stop_token_ids=eos_ids,
        logprobs=0,  # the sampled token's log-prob only
        detokenize=bool(p.stop),  # stop strings need text; completions are decoded by Tandem
        output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, with all n samples
    )


def seeds_for(
    params: SamplingParams | Sequence[SamplingParams], each: list[SamplingParams]
) -> list[int | None]:
    """One seed per prompt: a batch-wide seed spread over the prompts, a prompt's own seed kept (its output
    then does not depend on the other prompts), and unseeded prompts drawn from the global torch RNG.

    vLLM seeds sample ``j`` of a request with ``seed + j``: the batch-wide seeds are ``n`` apart (each
    prompt's sample count), so no two prompts share a random stream (1 apart, prompt ``i + 1``'s sample
    ``j`` drew prompt ``i``'s sample ``j + 1``: correlated groups)."""
    if isinstance(params, SamplingParams):
        if params.greedy:
            return [None] * len(each)
        base = params.seed if params.seed is not None else int(torch.randint(0, SEED_MOD, (1,)))
        starts = [0, *itertools.accumulate(p.n for p in each)][:-1]
        return [(base * 1_000_003 + start) % SEED_MOD for start in starts]
    return [
        None if p.greedy else (p.seed if p.seed is not None else int(torch.randint(0, SEED_MOD, (1,))))
        for p in each
    ]
