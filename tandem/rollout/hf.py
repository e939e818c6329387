"""Hugging Face rollout backend: batched sampling with a KV cache and our own decode loop.

Why not ``model.generate``: for small models the per-step Python overhead of ``generate`` (logits
processors, stopping criteria, cache and mask bookkeeping, output assembly) rivals the model itself, and
it does not return the untruncated per-token log-probs the trainer needs. This loop does one prefill and
one single-token forward per step, samples with :func:`~tandem.rollout.sampling.sample_next`, and checks
stop strings only on rows whose new token could complete one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tandem.errors import DataError, ModelError
from tandem.models.forward import positions_from_mask
from tandem.rollout.base import SamplingParams
from tandem.rollout.llama_decode import LlamaStepper, supports_fast_decode
from tandem.rollout.sampling import sample_next
from tandem.rollout.stepper import DecodeStepper, HFStepper
from tandem.rollout.stops import StopStrings
from tandem.types import RolloutBatch


@dataclass
class _Decoded:
    """Raw output of the decode loop (all on the model's device)."""

    tokens: torch.Tensor  # [B, R] long, pad after each row's end
    logprobs: torch.Tensor  # [B, R] float32, 0 after each row's end
    lengths: torch.Tensor  # [B] long, generated tokens per row (incl. EOS / stop tokens)
    stopped: torch.Tensor  # [B] bool, ended by EOS or a stop string (else by max_new_tokens)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration; the previous train/eval mode is restored after."""
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
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_prompt_len: int | None = None,
        add_special_tokens: bool = True,
        version: int = 0,
        fast_decode: bool | None = None,
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
        self._stops: dict[tuple[str, ...], StopStrings] = {}

    @property
    def version(self) -> int:
        """Weight version the engine currently samples with."""
        return self._version

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None, version: int) -> None:
        """Load ``state_dict`` (strict) into the model unless it is ``None``, then record ``version``."""
        if state_dict is not None:
            try:
                with torch.no_grad():
                    self.model.load_state_dict(state_dict, strict=True)
            except RuntimeError as err:
                first = str(err).strip().splitlines()[0]
                raise ModelError(f"weights do not match the rollout model: {first}") from err
        self._version = int(version)

    def generate(
        self,
        prompts: list[str],
        params: SamplingParams,
        *,
        group_offset: int = 0,
        extras: list[dict] | None = None,
        on_chunk: Callable[[], None] | None = None,
        chunk_tokens: int = 4,
    ) -> RolloutBatch:
        """Sample ``params.n`` responses per prompt; prompt ``i``'s samples are consecutive rows with group
        id ``group_offset + i``.

        ``on_chunk`` (in-flight weight updates, PipelineRL-style) is called after every ``chunk_tokens``
        decoded tokens while rows are still running; it may call :meth:`update_weights`. The KV cache of
        the tokens so far is kept, each token's behaviour log-prob is that of the weights that sampled it,
        and ``policy_version`` records the version at the start (the oldest weights that contributed), so
        staleness checks stay conservative."""
        if extras is not None and len(extras) != len(prompts):
            raise DataError(f"got {len(extras)} extras rows for {len(prompts)} prompts", where="extras")
        prompt_ids, prompt_mask = self._encode(prompts)  # [N, P] each
        prompt_ids = prompt_ids.repeat_interleave(params.n, dim=0)  # [B, P], B = N * n
        prompt_mask = prompt_mask.repeat_interleave(params.n, dim=0)
        device = next(self.model.parameters()).device
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=device).manual_seed(params.seed)
        stops = self._stop_strings(params.stop)
        start_version = self._version
        chunk = (on_chunk, max(1, int(chunk_tokens))) if on_chunk is not None else None
        with torch.inference_mode(), _eval_mode(self.model):
            out = self._decode(prompt_ids.to(device), prompt_mask.to(device), params, generator, stops, chunk)
        return self._to_batch(
            prompts, prompt_ids, prompt_mask, out, params, group_offset, extras, stops, start_version
        )

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise and left-pad ``prompts``: ids ``[N, P]`` long, mask ``[N, P]`` bool."""
        if not prompts:
            raise DataError("no prompts to generate from", where="prompts")
        encoded = self.tokenizer(list(prompts), add_special_tokens=self.add_special_tokens)["input_ids"]
        for i, ids in enumerate(encoded):
            if not ids:
                raise DataError(f"prompt {i} is empty", where=f"prompts[{i}]")
            if self.max_prompt_len is not None and len(ids) > self.max_prompt_len:
                raise DataError(
                    f"prompt {i} has {len(ids)} tokens, more than max_prompt_len={self.max_prompt_len}",
                    where=f"prompts[{i}]",
                    hint="shorten the prompt or raise data.max_prompt_len",
                )
        P = max(len(ids) for ids in encoded)
        prompt_ids = torch.full((len(encoded), P), self.tokenizer.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((len(encoded), P), dtype=torch.bool)
        for i, ids in enumerate(encoded):
            prompt_ids[i, P - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            prompt_mask[i, P - len(ids) :] = True
        return prompt_ids, prompt_mask

    def _stop_strings(self, stop: list[str]) -> StopStrings | None:
        """The (cached) stop-string checker for ``stop``, or None when there are no stop strings."""
        if not stop:
            return None
        key = tuple(stop)
        if key not in self._stops:
            self._stops[key] = StopStrings(self.tokenizer, list(stop))
        return self._stops[key]

    def _stepper(self, batch_size: int, max_len: int) -> DecodeStepper:
        """The model-forward strategy for this call (see ``fast_decode`` in the class docstring)."""
        fast_ok = self.fast_decode is not False and supports_fast_decode(self.model, max_len)
        if self.fast_decode is True and not fast_ok:
            raise ModelError(
                f"fast_decode=True but {type(self.model).__name__} does not support the fast Llama path",
                hint="use fast_decode=None to fall back automatically",
            )
        return LlamaStepper(self.model, batch_size, max_len) if fast_ok else HFStepper(self.model)

    def _decode(
        self,
        prompt_ids: torch.Tensor,  # [B, P] long, left padded
        prompt_mask: torch.Tensor,  # [B, P] bool
        params: SamplingParams,
        generator: torch.Generator | None,
        stops: StopStrings | None,
        chunk: tuple[Callable[[], None], int] | None = None,
    ) -> _Decoded:
        """Prefill, then sample one token per step until every row hit EOS, a stop string or the limit."""
        B, P = prompt_ids.shape
        T, device, pad = params.max_new_tokens, prompt_ids.device, self.tokenizer.pad_token_id
        attn = torch.zeros((B, P + T), dtype=torch.long, device=device)  # [B, P+T], grows by a column/step
        attn[:, :P] = prompt_mask.long()
        tokens = torch.full((B, T), pad, dtype=torch.long, device=device)  # [B, T]
        logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)  # [B, T]
        lengths = torch.zeros(B, dtype=torch.long, device=device)  # [B]
        finished = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
        eos = torch.tensor(self._eos_ids, dtype=torch.long, device=device)
        next_pos = prompt_mask.long().sum(dim=1, keepdim=True)  # [B, 1] position of the first new token
        stepper = self._stepper(B, P + T)
        logits = stepper.prefill(prompt_ids, attn[:, :P], positions_from_mask(prompt_mask))  # [B, V]
        steps = T
        for t in range(T):
            new, new_lp = sample_next(logits, params, generator)  # [B], [B]
            tokens[:, t] = new.masked_fill(finished, pad)
            logprobs[:, t] = new_lp.masked_fill(finished, 0.0)
            lengths += (~finished).long()
            hit = ~finished & torch.isin(new, eos)  # [B]
            if stops is not None:
                hit |= stops.check(tokens[:, : t + 1], new, ~finished & ~hit)
            finished |= hit
            if t == T - 1 or bool(finished.all()):
                steps = t + 1
                break
            if chunk is not None and (t + 1) % chunk[1] == 0:
                chunk[0]()  # may load newer weights in place; the stepper reads the model's own tensors
            attn[:, P + t] = 1
            logits = stepper.step(tokens[:, t : t + 1], attn[:, : P + t + 1], next_pos + t)
        return _Decoded(tokens[:, :steps], logprobs[:, :steps], lengths, finished)

    def _to_batch(
        self,
        prompts: list[str],
        prompt_ids: torch.Tensor,  # [B, P]
        prompt_mask: torch.Tensor,  # [B, P]
        out: _Decoded,
        params: SamplingParams,
        group_offset: int,
        extras: list[dict] | None,
        stops: StopStrings | None,
        version: int,
    ) -> RolloutBatch:
        """Assemble the RolloutBatch: decode completions, cut stop strings, label rows."""
        n, B = params.n, prompt_ids.shape[0]
        # Copies made outside inference mode are ordinary tensors, usable in autograd by the trainer.
        tokens, lengths = out.tokens.to("cpu", copy=True), out.lengths.to("cpu", copy=True)
        R = tokens.shape[1]
        response_mask = torch.arange(R).unsqueeze(0) < lengths.unsqueeze(1)  # [B, R]
        rows = [row[:length].tolist() for row, length in zip(tokens, lengths.tolist(), strict=True)]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        if stops is not None:
            texts = [stops.cut(text)[0] for text in texts]
        groups = torch.arange(len(prompts), dtype=torch.long).repeat_interleave(n) + group_offset  # [B]
        tag = uuid.uuid4().hex[:8]
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=tokens,
            response_mask=response_mask,
            behavior_logprobs=out.logprobs.to("cpu", copy=True),
            group_ids=groups,
            policy_version=torch.full((B,), version, dtype=torch.long),
            prompts=[p for p in prompts for _ in range(n)],
            completions=texts,
            finish_reasons=["stop" if s else "length" for s in out.stopped.tolist()],
            sample_ids=[f"{tag}-{version}-{g}-{k}" for g in groups.tolist()[::n] for k in range(n)],
            extras=[dict(e) for e in (extras or [{}] * len(prompts)) for _ in range(n)],
        )


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
