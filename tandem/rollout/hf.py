"""Hugging Face rollout backend: batched sampling with a KV cache and our own decode loop.

Why not ``model.generate``: for small models the per-step Python overhead of ``generate`` (logits
processors, stopping criteria, cache and mask bookkeeping, output assembly) rivals the model itself, and
it does not return the untruncated per-token log-probs the trainer needs. This loop does one prefill and
one single-token forward per step, samples with :func:`~tandem.rollout.sampling.sample_next`, and checks
stop strings only on rows whose new token could complete one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tandem.errors import DataError, ModelError
from tandem.models import load_model, load_tokenizer
from tandem.models.forward import positions_from_mask, response_logprobs, unique_rows
from tandem.rollout.assemble import assemble_batch, completion_texts, repeats
from tandem.rollout.base import ChunkCallback, EngineSpec, SamplingParams
from tandem.rollout.llama_decode import LlamaStepper, supports_fast_decode
from tandem.rollout.prompts import encode_prompts, left_pad
from tandem.rollout.registry import parse_engine_options
from tandem.rollout.rows import RowSampling, per_prompt
from tandem.rollout.sampling import sample_next, seen_tokens
from tandem.rollout.stepper import DecodeStepper, HFStepper
from tandem.rollout.stops import StopStrings
from tandem.types import RolloutBatch

# logits [B, V] and the tokens each row has seen ([B, V] bool; None unless penalised) -> tokens, log-probs
Sampler = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
RowStops = list[tuple[StopStrings, torch.Tensor | None]]  # a checker and the rows it applies to (None: all)


class HFOptions(BaseModel):
    """``rollout.engine_options`` of the ``hf`` engine."""

    model_config = ConfigDict(extra="forbid")
    fast_decode: bool | None = Field(
        None, description="None: the fast Llama path where exact, else generic; False: generic; True: fast."
    )
    shared_decode: bool = Field(
        True,
        description="Each decode step runs one forward per distinct unfinished row (same prompt, same "
        "tokens so far: a prompt's samples until they diverge); same logits, less compute. False: every "
        "row runs every step.",
    )


@dataclass
class _Plan:
    """One call's rows: per-row sampling, limits and stop strings (see :mod:`tandem.rollout.rows`)."""

    counts: list[int]  # rows per prompt
    max_new_tokens: int  # the longest row limit
    sample: Sampler
    stops: RowStops
    limits: torch.Tensor | None = None  # [B] long per-row limits; None: every row has max_new_tokens
    cut: list[StopStrings | None] | None = None  # per row; None: stops[0] (or nothing) for every row
    penalised: bool = False  # some row has a repetition penalty: the loop tracks the tokens each row saw


@dataclass
class _Decoded:
    """Raw output of the decode loop (all on the model's device)."""

    tokens: torch.Tensor  # [B, R] long, pad after each row's end
    logprobs: torch.Tensor  # [B, R] float32, 0 after each row's end
    lengths: torch.Tensor  # [B] long, generated tokens per row (incl. EOS / stop tokens)
    stopped: torch.Tensor  # [B] bool, ended by EOS or a stop string (else by max_new_tokens)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module, needed: bool = True) -> Iterator[None]:
    """Eval mode (no dropout) for the duration; the previous train/eval mode is restored after.
    ``needed=False``: the forward reads no module's mode (the fast Llama stepper: its own ops and plain
    projections), so the two walks over every module (≈ 1 ms each for a 4-layer model) are skipped."""
    if not needed:
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class HFEngine:
    """A :class:`~tandem.rollout.base.RolloutEngine` over an in-process Hugging Face causal LM.

    Colocated runs pass the very model being trained and call ``update_weights(None, version)`` after each
    update; a separate rollout process passes its own copy and receives state dicts. Prompts are encoded
    with the tokenizer's special tokens unless ``add_special_tokens=False`` (e.g. when a chat template
    already added BOS). Returned tensors are on the CPU.

    ``fast_decode``: ``None`` uses :class:`~tandem.rollout.llama_decode.LlamaStepper` when
    :func:`~tandem.rollout.llama_decode.supports_fast_decode` allows it and the generic
    :class:`~tandem.rollout.stepper.HFStepper` otherwise; ``False`` forces the generic path; ``True``
    requires the fast path (ModelError if the model does not qualify).

    ``shared_decode``: rows whose prompt and sampled tokens so far are identical have identical next-token
    logits, so each decode step runs the model once per such *state* and hands its logits to each of its
    rows, which sample independently (:func:`advance_states`); finished rows drop out of the forward.
    A prompt's ``n`` samples cost one row until they diverge — for short answers from a confident policy,
    most of a group. Same logits, hence the same samples for the same seed (to float rounding of the
    smaller matmuls); False runs every row every step.
    """

    truncated_logprobs = False  # behaviour log-probs are untruncated (what the trainer recomputes)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_prompt_len: int | None = None,
        add_special_tokens: bool = True,
        version: int = 0,
        fast_decode: bool | None = None,
        shared_decode: bool = True,
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ModelError("tokenizer has no pad token", hint="load it with tandem.models.load_tokenizer")
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.add_special_tokens = add_special_tokens
        self._version = version
        self._eos_ids = _eos_ids(model, tokenizer)
        self.fast_decode = fast_decode
        self.shared_decode = shared_decode
        self._stops: dict[tuple[str, ...], StopStrings] = {}
        self._closed = False

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> HFEngine:
        """The registry's constructor: samples with ``spec.model`` (shared, not copied) or loads
        ``spec.path``; ``spec.options`` are :class:`HFOptions`."""
        opts = parse_engine_options(HFOptions, spec.options, where="rollout.engine_options")
        if spec.model is None and spec.path is None:
            raise ModelError("the hf engine needs a model or a model folder", where="rollout.backend")
        model = spec.model if spec.model is not None else load_model(spec.path, dtype=spec.dtype or "float32")
        tokenizer = spec.tokenizer if spec.tokenizer is not None else load_tokenizer(spec.path)
        return cls(
            model,
            tokenizer,
            max_prompt_len=spec.max_prompt_len,
            add_special_tokens=spec.add_special_tokens,
            version=spec.version,
            fast_decode=opts.fast_decode,
            shared_decode=opts.shared_decode,
        )

    @property
    def version(self) -> int:
        """Weight version the engine currently samples with."""
        return self._version

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None, version: int) -> None:
        """Load ``state_dict`` (strict) into the model, then record ``version``. Nothing is copied for
        ``None`` or for the model's own state dict (a colocated trainer publishing the module it shares
        with this engine)."""
        if state_dict is not None and not self._owns(state_dict):
            try:
                with torch.no_grad():
                    self.model.load_state_dict(state_dict, strict=True)
            except RuntimeError as err:
                first = str(err).strip().splitlines()[0]
                raise ModelError(f"weights do not match the rollout model: {first}") from err
        self._version = int(version)

    def _owns(self, state_dict: dict[str, torch.Tensor]) -> bool:
        """True when every tensor of ``state_dict`` is the model's own (same storage): nothing to load."""
        own = self.model.state_dict()
        return own.keys() == state_dict.keys() and all(
            t.data_ptr() == own[k].data_ptr() and t.shape == own[k].shape for k, t in state_dict.items()
        )

    def close(self) -> None:
        """Forget the cached stop-string tables; the model stays with its owner. Idempotent."""
        self._stops.clear()
        self._closed = True

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
        """Sample ``params.n`` responses per prompt; prompt ``i``'s samples are consecutive rows with group
        id ``group_offset + i``. ``params`` may also be one :class:`SamplingParams` per prompt.

        ``on_chunk`` (in-flight weight updates, PipelineRL-style) is called after every ``chunk_tokens``
        decoded tokens while rows are still running; it may call :meth:`update_weights`. The KV cache of
        the tokens so far is kept, each token's behaviour log-prob is that of the weights that sampled it,
        and ``policy_version`` records the version at the start (the oldest weights that contributed), so
        staleness checks stay conservative."""
        if self._closed:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        if extras is not None and len(extras) != len(prompts):
            raise DataError(f"got {len(extras)} extras rows for {len(prompts)} prompts", where="extras")
        prompt_ids, prompt_mask = self._encode(prompts)  # [N, P] each
        return self._generate_encoded(
            prompts, prompt_ids, prompt_mask, params, group_offset, extras, on_chunk, chunk_tokens
        )

    def score(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        response_ids: torch.Tensor,  # [B, R] long, right padded
        response_mask: torch.Tensor,  # [B, R] bool
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Teacher-forced log-probs of ``response_ids`` under the engine's weights at ``temperature``:
        ``[B, R]`` float32, 0 on padding (:class:`~tandem.rollout.base.ScoresCompletions`)."""
        if self._closed:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        device = next(self.model.parameters()).device
        with torch.inference_mode(), _eval_mode(self.model):
            lp, _ = response_logprobs(
                self.model,
                prompt_ids.to(device),
                prompt_mask.to(device),
                response_ids.to(device),
                response_mask.to(device),
                temperature=temperature,
            )
        return lp.to("cpu", dtype=torch.float32)

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
    ) -> RolloutBatch:
        """:meth:`generate` from token ids, used as they are (no tokenisation, no length limit): the
        continuation of a multi-turn episode whose history must stay token-exact. ``prompts`` of the
        batch are the ids decoded, for display only."""
        if self._closed:
            raise ModelError("the rollout engine was closed", hint="build a new one")
        if not prompt_ids or any(not ids for ids in prompt_ids):
            raise DataError("generate_ids needs non-empty token-id prompts", where="prompt_ids")
        texts = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=False)
        ids, mask = left_pad([list(p) for p in prompt_ids], self.tokenizer.pad_token_id)
        return self._generate_encoded(texts, ids, mask, params, group_offset, extras, None, 4)

    def _generate_encoded(
        self,
        prompts: list[str],
        prompt_ids: torch.Tensor,  # [N, P] long, left padded
        prompt_mask: torch.Tensor,  # [N, P] bool
        params: SamplingParams | Sequence[SamplingParams],
        group_offset: int,
        extras: list[dict] | None,
        on_chunk: ChunkCallback | None,
        chunk_tokens: int,
    ) -> RolloutBatch:
        """The body of :meth:`generate` after the prompts are encoded."""
        device = next(self.model.parameters()).device
        plan = self._plan(params, len(prompts), device)
        prompt_ids = prompt_ids.repeat_interleave(repeats(plan.counts), dim=0)  # [B, P], B = sum of n
        prompt_mask = prompt_mask.repeat_interleave(repeats(plan.counts), dim=0)
        start_version = self._version
        chunk = (on_chunk, max(1, int(chunk_tokens))) if on_chunk is not None else None
        fast = self._fast_ok(prompt_ids.shape[1] + plan.max_new_tokens)
        with torch.inference_mode(), _eval_mode(self.model, needed=not fast):
            out = self._decode(prompt_ids.to(device), prompt_mask.to(device), plan, chunk, fast)
        return self._to_batch(
            prompts, prompt_ids, prompt_mask, out, plan, group_offset, extras, start_version
        )

    def _plan(
        self, params: SamplingParams | Sequence[SamplingParams], num_prompts: int, device: torch.device
    ) -> _Plan:
        """How this call samples: one ``SamplingParams`` for the batch (one RNG stream, as training
        uses), or per-prompt parameters (:class:`~tandem.rollout.rows.RowSampling`)."""
        if isinstance(params, SamplingParams):
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=device).manual_seed(params.seed)
            checker = self._stop_strings(params.stop)

            def sample(logits: torch.Tensor, seen: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
                return sample_next(logits, params, generator, seen)

            return _Plan(
                [params.n] * num_prompts,
                params.max_new_tokens,
                sample,
                [] if checker is None else [(checker, None)],
                penalised=params.penalised,
            )
        each = per_prompt(params, num_prompts)
        rows = [p for p in each for _ in range(p.n)]
        row_prompt = [i for i, p in enumerate(each) for _ in range(p.n)]
        stops: RowStops = []
        for key in dict.fromkeys(tuple(p.stop) for p in each if p.stop):
            mask = torch.tensor([tuple(p.stop) == key for p in rows], device=device)  # [B] its rows
            checker = self._stop_strings(list(key))
            if checker is not None:  # always: key is not empty
                stops.append((checker, mask))
        limits = torch.tensor([p.max_new_tokens for p in rows], device=device)
        sample = RowSampling(rows, row_prompt, device)
        cut = [self._stop_strings(p.stop) for p in rows]  # cached: one checker per distinct list
        return _Plan([p.n for p in each], int(limits.max()), sample, stops, limits, cut, sample.penalised)

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise and left-pad ``prompts``: ids ``[N, P]`` long, mask ``[N, P]`` bool."""
        encoded = encode_prompts(
            self.tokenizer,
            prompts,
            add_special_tokens=self.add_special_tokens,
            max_prompt_len=self.max_prompt_len,
        )
        return left_pad(encoded, self.tokenizer.pad_token_id)

    def _stop_strings(self, stop: list[str]) -> StopStrings | None:
        """The (cached) stop-string checker for ``stop``, or None when there are no stop strings."""
        if not stop:
            return None
        key = tuple(stop)
        if key not in self._stops:
            self._stops[key] = StopStrings(self.tokenizer, list(stop))
        return self._stops[key]

    def _fast_ok(self, max_len: int) -> bool:
        """Whether this call decodes with the fast Llama stepper (see ``fast_decode`` in the class
        docstring); ModelError when it is required and the model does not qualify."""
        fast_ok = self.fast_decode is not False and supports_fast_decode(self.model, max_len)
        if self.fast_decode is True and not fast_ok:
            raise ModelError(
                f"fast_decode=True but {type(self.model).__name__} does not support the fast Llama path",
                hint="use fast_decode=None to fall back automatically",
            )
        return fast_ok

    def _decode(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        plan: _Plan,
        chunk: tuple[ChunkCallback, int] | None = None,
        fast: bool = False,
    ) -> _Decoded:
        """Prefill, then sample one token per step until every row hit EOS, a stop string or its limit."""
        B, P = prompt_ids.shape
        T, device, pad = plan.max_new_tokens, prompt_ids.device, self.tokenizer.pad_token_id
        attn = torch.zeros((B, P + T), dtype=torch.long, device=device)  # [B, P+T], grows by a column/step
        attn[:, :P] = prompt_mask.long()
        tokens = torch.full((B, T), pad, dtype=torch.long, device=device)  # [B, T]
        logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)  # [B, T]
        lengths = torch.zeros(B, dtype=torch.long, device=device)  # [B]
        finished = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
        stopped = finished.clone()  # [B] ended by EOS or a stop string (tracked with per-row limits only)
        eos = torch.tensor(self._eos_ids, dtype=torch.long, device=device)
        next_pos = prompt_mask.long().sum(dim=1, keepdim=True)  # [B, 1] position of the first new token
        stepper = LlamaStepper(self.model, B, P + T) if fast else HFStepper(self.model)
        logits = stepper.prefill(prompt_ids, attn[:, :P], positions_from_mask(prompt_mask))  # [B, V]
        # each row's state: its row in the stepper's cache (after the prefill: its prompt's first row)
        state, reps, cache_rows = None, None, B  # reps: a row of each state
        if self.shared_decode:
            first, back = unique_rows(torch.cat([prompt_ids, prompt_mask.long()], dim=1))
            state = first[back]  # [B]
        seen = seen_tokens(prompt_ids, prompt_mask, logits.shape[-1]) if plan.penalised else None  # [B, V]
        steps = T
        for t in range(T):
            new, new_lp = plan.sample(logits, seen)  # [B], [B]
            if seen is not None:
                seen[torch.arange(B, device=device), new] = True
            tokens[:, t] = new.masked_fill(finished, pad)
            logprobs[:, t] = new_lp.masked_fill(finished, 0.0)
            lengths += (~finished).long()
            hit = ~finished & torch.isin(new, eos)  # [B]
            for stops, rows in plan.stops:
                active = ~finished & ~hit if rows is None else ~finished & ~hit & rows
                hit |= stops.check(tokens[:, : t + 1], new, active)
            finished |= hit
            if plan.limits is not None:
                stopped |= hit
                finished |= lengths >= plan.limits
            if t == T - 1 or bool(finished.all()):
                steps = t + 1
                break
            if chunk is not None and (t + 1) % chunk[1] == 0:
                chunk[0]()  # may load newer weights in place; the stepper reads the model's own tensors
            attn[:, P + t] = 1
            if state is not None:
                moved = advance_states(stepper, state, tokens[:, t], ~finished, cache_rows)
                state, reps = moved if moved is not None else (None, None)  # None: the cache cannot select
            if reps is None:
                logits = stepper.step(tokens[:, t : t + 1], attn[:, : P + t + 1], next_pos + t)
            else:  # one forward per state, its logits to each of its rows
                cache_rows = reps.numel()
                out = stepper.step(tokens[reps, t : t + 1], attn[reps, : P + t + 1], next_pos[reps] + t)
                logits = out[state]  # [B, V]
        return _Decoded(
            tokens[:, :steps], logprobs[:, :steps], lengths, finished if plan.limits is None else stopped
        )

    def _to_batch(
        self,
        prompts: list[str],
        prompt_ids: torch.Tensor,  # [B, P]
        prompt_mask: torch.Tensor,  # [B, P]
        out: _Decoded,
        plan: _Plan,
        group_offset: int,
        extras: list[dict] | None,
        version: int,
    ) -> RolloutBatch:
        """Assemble the RolloutBatch: decode completions, cut stop strings, label rows."""
        # Copies made outside inference mode are ordinary tensors, usable in autograd by the trainer.
        rows = [row[:length].tolist() for row, length in zip(out.tokens, out.lengths.tolist(), strict=True)]
        cut = plan.cut if plan.cut is not None else [plan.stops[0][0] if plan.stops else None] * len(rows)
        return assemble_batch(
            prompts=prompts,
            counts=plan.counts,
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            tokens=out.tokens,
            logprobs=out.logprobs,
            lengths=out.lengths,
            stopped=out.stopped.tolist(),
            texts=completion_texts(self.tokenizer, rows, cut),
            group_offset=group_offset,
            extras=extras,
            version=version,
        )


def advance_states(
    stepper: DecodeStepper,
    state: torch.Tensor,  # [B] long, each row's row in the stepper's cache
    token: torch.Tensor,  # [B] long, the token each row just sampled
    alive: torch.Tensor,  # [B] bool, rows still decoding
    cache_rows: int,  # rows in the stepper's cache now
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The decode states after one sampled token: rows of one state that sampled the same token stay one
    state; the stepper's cache keeps one row per new state (its parent's, ``stepper.select``), finished
    rows none. Returns each row's new state ``[B]`` (finished rows: 0, their logits are never used) and a
    row of each state ``[S]`` (whose token, mask and position the step feeds), or None when the stepper
    cannot select rows. The cache is left as is when it already holds exactly the new states in order."""
    B = state.shape[0]
    live = alive.nonzero().squeeze(1)  # [b]
    first, back = unique_rows(torch.stack([state[live], token[live]], dim=1))  # [S], [b]
    rows = live[first]  # [S]
    parents = state[rows]  # [S] each new state's row in the cache
    same = parents.numel() == cache_rows and bool(
        (parents == torch.arange(cache_rows, device=parents.device)).all()
    )
    if not same and not stepper.select(parents):
        return None
    new_state = torch.zeros(B, dtype=torch.long, device=state.device)
    new_state[live] = back
    return new_state, rows


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end a response: the tokenizer's EOS plus any in the model's generation config."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config = getattr(model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(i) for i in extra)
    if not ids:
        raise ModelError("neither the tokenizer nor the generation config defines an EOS token")
    return sorted(ids)
