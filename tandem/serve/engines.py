"""How ``tandem serve`` generates: every replica of an arm is a rollout engine built by name through
:func:`tandem.rollout.registry.build_engine` (``tandem serve --engine NAME``).

Two ways a replica turns queued rows into answers:

- **in process** — the in-process engine (``hf``, :data:`~tandem.rollout.registry.IN_PROCESS_ENGINE`)
  samples with the module the server loaded (all replicas of an arm share it, read-only). Its rows run
  through :func:`tandem.serve.decode.decode_rows`, the server's own decoder: tokens stream as they are
  sampled, and every OpenAI field works (token-id prompts, ``top_logprobs``, ``echo`` with log-probs,
  ``logit_bias``, penalties, cancellation of a disconnected client's rows).
- **through the engine** — any other engine (e.g. ``vllm``) loads its own copy of the model folder
  (``EngineSpec.path``) and each batch is one ``engine.generate`` call with one
  :class:`~tandem.rollout.base.SamplingParams` per row (:class:`EngineRows`). The engine protocol returns
  finished rows with the sampled tokens' log-probs, so a stream delivers its tokens when the batch ends,
  and requests asking for what the protocol does not carry get a 400 naming the field
  (:func:`check_request`) instead of a silently different answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.rollout import IN_PROCESS_ENGINE, EngineSpec, RolloutEngine, build_engine
from tandem.serve.decode import RowRequest, RowResult, TokenCallback, TokenLogprob, decode_rows
from tandem.serve.model import ServedModel
from tandem.serve.protocol import ApiError
from tandem.serve.replicas import Factory, ReplicaParts, Runner


def shares_module(engine: str) -> bool:
    """Whether ``engine`` samples with a module this process loads (else it loads the folder itself)."""
    return engine == IN_PROCESS_ENGINE


def load_served(path: str, name: str, engine: str) -> ServedModel:
    """``path`` loaded for ``engine``: with its weights for the in-process engine, else tokenizer and
    config only (the engine loads the weights)."""
    return ServedModel.load(path, name=name, engine=None if shares_module(engine) else engine)


def replica_factory(served: ServedModel, engine: str, options: Mapping[str, Any]) -> Factory:
    """Builds one replica of ``served``: an engine from the registry and the runner that drives it. The
    spec carries the folder (``path``) for an engine that loads its own copy, and the loaded module
    (``model``) for one that shares it."""

    def build() -> ReplicaParts:
        spec = EngineSpec(
            model=served.model, tokenizer=served.tokenizer, path=str(served.folder), options=dict(options)
        )
        built = build_engine(engine, spec)
        return runner_for(built, served), built.close

    return build


def runner_for(engine: RolloutEngine, served: ServedModel) -> Runner:
    """The server's own decoder over ``served.model`` when ``engine`` samples with that very module, else
    :class:`EngineRows` over ``engine``."""
    if served.model is not None and getattr(engine, "model", None) is served.model:
        fast = getattr(engine, "fast_decode", None)

        def run(rows: list[RowRequest], on_token: TokenCallback) -> list[RowResult]:
            return decode_rows(served.model, served.tokenizer, rows, on_token, fast_decode=fast)

        return run
    return EngineRows(engine, served.tokenizer)


class EngineRows:
    """Generates a batch of rows with one ``engine.generate`` call (one ``SamplingParams`` per row, from
    the row's prompt text) and reports each row's tokens with their behaviour log-probs; streamed rows get
    their tokens when the batch ends. Rows cancelled before the call are skipped (no tokens)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer

    def __call__(self, rows: list[RowRequest], on_token: TokenCallback | None = None) -> list[RowResult]:
        results = [RowResult(token_ids=[], finish_reason="length") for _ in rows]
        live = [i for i, row in enumerate(rows) if not row.cancelled()]
        if not live:
            return results
        for i in live:
            if rows[i].prompt_text is None:
                raise ValueError("this engine generates from prompt text; the row has token ids only")
        batch = self.engine.generate([rows[i].prompt_text for i in live], [rows[i].params for i in live])
        lengths = batch.response_lengths.tolist()  # [B]
        for k, i in enumerate(live):
            ids = batch.response_ids[k, : lengths[k]].tolist()
            logprobs = batch.behavior_logprobs[k, : lengths[k]].tolist()
            entries = [TokenLogprob(t, lp) for t, lp in zip(ids, logprobs, strict=True)]
            results[i] = RowResult(ids, batch.finish_reasons[k], text=batch.completions[k], logprobs=entries)
            if on_token is not None:
                for entry in entries:
                    on_token(i, entry)
        return results


def check_request(
    engine: str | None,
    *,
    token_prompts: bool,
    top_logprobs: int,
    prompt_logprobs: bool,
    logit_bias: bool,
    penalties: bool,
) -> None:
    """400 naming the first field an arm served through ``engine`` (None: in process, everything goes)
    cannot honour."""
    if engine is None:
        return
    refused = [
        (token_prompts, "prompt", "token-id prompts"),
        (top_logprobs > 0, "top_logprobs", "top_logprobs alternatives"),
        (prompt_logprobs, "echo", "prompt log-probs (echo with logprobs)"),
        (logit_bias, "logit_bias", "logit_bias"),
        (penalties, "presence_penalty", "presence/frequency penalties"),
    ]
    for asked, param, what in refused:
        if asked:
            raise ApiError(
                400,
                f"{what}: not supported by the '{engine}' engine this server runs "
                f"(the in-process engine '{IN_PROCESS_ENGINE}' supports it)",
                param=param,
                code="unsupported_by_engine",
            )
