"""Per-phase cost model of one RL step: generate (prefill + decode), reward, log-prob, update, weight sync and
channel transfer, from the model's size, the tokens per sample, the samples per step and device figures.

Pure functions over frozen dataclasses; the formulas are written out in ``docs/planning.md``. Everything is
in seconds for one step's batch (``samples_per_step`` completions). The model is a roofline: a phase takes
the longer of its FLOPs at an efficiency-scaled peak and its bytes at an efficiency-scaled bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from tandem.errors import ConfigError
from tandem.plan.devices import Device

_CHUNKS = 256  # decode steps are summed over at most this many length chunks


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder: parameter count, depth, width and the share of KV heads (GQA)."""

    params: float
    layers: int
    d_model: int
    kv_fraction: float = 0.25  # KV heads / query heads
    bytes_per_param: int = 2  # bf16 weights in the rollout engine

    @classmethod
    def from_params(cls, params: float, *, kv_fraction: float = 0.25, bytes_per_param: int = 2) -> ModelShape:
        """Shape of a typical model of ``params`` parameters: ``params ≈ 12·layers·d²`` with
        ``d ≈ 128·layers`` (7e9 → 33 layers of width 4224, close to Llama-2-7B's 32 × 4096)."""
        if not params > 0:
            raise ConfigError(f"model size must be positive, got {params}", where="--model-params")
        d = max(64, round((params * 128 / 12) ** (1 / 3) / 64) * 64)
        layers = max(1, round(params / (12 * d * d)))
        return cls(float(params), layers, d, kv_fraction, bytes_per_param)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.d_model * self.kv_fraction * self.bytes_per_param


@dataclass(frozen=True)
class LengthDist:
    """Completion lengths: log-normal with this mean and coefficient of variation, cut at ``max_len`` (the
    generation budget). The cut puts the tail's mass at ``max_len`` (truncated completions)."""

    mean: float
    max_len: int
    cv: float = 0.6

    def __post_init__(self) -> None:
        if not (self.mean > 0 and self.max_len >= 1 and self.cv >= 0):
            raise ConfigError(
                f"completion lengths need mean > 0, max >= 1, cv >= 0 (got {self.mean}, {self.max_len}, "
                f"{self.cv})",
                where="--completion-len",
            )

    @property
    def _sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv**2))

    @property
    def _mu(self) -> float:
        return math.log(self.mean) - self._sigma**2 / 2

    def survival(self, t: float) -> float:
        """P(length ≥ t): the share of completions still decoding at token ``t``."""
        if t <= 0:
            return 1.0
        if t > self.max_len:
            return 0.0
        if self._sigma == 0:
            return 1.0 if t <= self.mean else 0.0
        return 1.0 - NormalDist().cdf((math.log(t) - self._mu) / self._sigma)

    def quantile(self, q: float) -> float:
        if self._sigma == 0:
            return min(self.mean, self.max_len)
        return min(float(self.max_len), math.exp(self._mu + self._sigma * NormalDist().inv_cdf(q)))

    def expected_max(self, n: int) -> float:
        """Length of the longest of ``n`` completions (the ``n/(n+1)`` quantile): how long a batch decodes."""
        return self.quantile(n / (n + 1)) if n > 0 else 0.0

    @property
    def capped_mean(self) -> float:
        """Mean length after the cut: Σ_t P(L ≥ t), summed over chunks."""
        step = max(1.0, self.max_len / _CHUNKS)
        total, t = 0.0, step / 2
        while t < self.max_len:
            total += self.survival(t) * step
            t += step
        return min(total, float(self.max_len))


@dataclass(frozen=True)
class Workload:
    """What one step processes."""

    model: ModelShape
    prompt_len: int
    completion: LengthDist
    samples_per_step: int
    group_size: int = 8  # samples per prompt (they share the prompt's prefill)
    update_epochs: int = 1  # passes of the optimiser over the batch
    reference: bool = False  # a KL reference model scores the batch (β > 0)
    reward_s_per_sample: float = 0.0  # rule-based reward time per completion (run in parallel by engines)

    @property
    def tokens_per_sample(self) -> float:
        return self.prompt_len + self.completion.capped_mean

    @property
    def tokens_per_step(self) -> float:
        return self.samples_per_step * self.tokens_per_sample


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the device peaks that each kind of work reaches, and fixed costs (all assumptions,
    documented in docs/planning.md; ``tandem plan --calibrate`` measures the real ones on a run)."""

    train_mfu: float = 0.35  # update: forward + backward
    forward_mfu: float = 0.45  # log-prob scoring passes
    prefill_mfu: float = 0.5
    decode_mfu: float = 0.3  # compute roof of a decode step
    bw: float = 0.7  # share of memory bandwidth a decode step reaches
    max_seqs: int = 256  # concurrent sequences per engine (vLLM's default max_num_seqs)
    sync_bw: float = 0.25  # share of link bandwidth a weight broadcast reaches (gather, reshard, copy)
    sync_latency_s: float = 0.5  # fixed cost of one weight update on the rollout side
    switch_s: float = 1.0  # colocated: offload/reload between the engine and the trainer, per step
    train_bytes_per_param: float = 18.0  # bf16 weights + fp32 master, grads and two Adam moments


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per step for each phase, as the simulator consumes them.

    Rollout side (per ticket = one step's batch): ``weight_load`` (fetch new weights), ``generate``,
    ``reward``, ``transfer`` (put on the channel). Learner side: ``logprob``, ``update``, ``weight_sync``
    (publish) and ``overhead`` (after the step: logging, checkpoints; overlaps the rollout side when
    decoupled). ``*_cv``: coefficients of variation of the rollout and learner work between steps.
    """

    generate: float
    reward: float = 0.0
    logprob: float = 0.0
    update: float = 0.0
    weight_sync: float = 0.0
    weight_load: float = 0.0
    transfer: float = 0.0
    overhead: float = 0.0
    rollout_cv: float = 0.0
    learn_cv: float = 0.0

    @property
    def rollout_s(self) -> float:
        return self.weight_load + self.generate + self.reward + self.transfer

    @property
    def learn_s(self) -> float:
        return self.logprob + self.update

    @property
    def colocated_step_s(self) -> float:
        return self.generate + self.reward + self.logprob + self.update + self.weight_sync + self.overhead

    def scaled(self, *, rollout: float = 1.0, learn: float = 1.0) -> PhaseTimes:
        """The same phases with the rollout side ``rollout``× and the learner side ``learn``× as long."""
        return replace(
            self,
            generate=self.generate * rollout,
            reward=self.reward * rollout,
            logprob=self.logprob * learn,
            update=self.update * learn,
        )


# -- memory -------------------------------------------------------------------------------------------------
def tensor_parallel(model: ModelShape, device: Device) -> int:
    """Devices per inference engine: the smallest power of two (within a node) holding the weights in half
    of its memory, leaving the rest for the KV cache."""
    tp = 1
    while model.weight_bytes > 0.5 * tp * device.mem_bytes:
        tp *= 2
        if tp > device.per_node:
            raise ConfigError(
                f"a {model.params:.3g}-parameter model does not fit one {device.name} node for inference",
                where="--model-params",
            )
    return tp


def min_train_devices(model: ModelShape, device: Device, eff: Efficiency) -> int:
    """Fewest devices whose memory holds the sharded training state (FSDP/ZeRO-3) at 80 % use."""
    return max(1, math.ceil(model.params * eff.train_bytes_per_param / (0.8 * device.mem_bytes)))


def kv_capacity(model: ModelShape, device: Device, tp: int, context: float) -> int:
    """Sequences of ``context`` tokens whose KV cache fits an engine of ``tp`` devices (90 % memory use)."""
    free = 0.9 * tp * device.mem_bytes - model.weight_bytes
    return max(1, int(free / max(1.0, context * model.kv_bytes_per_token)))


# -- phases -------------------------------------------------------------------------------------------------
def _decode_step_s(
    w: Workload, device: Device, tp: int, active: float, context: float, eff: Efficiency
) -> float:
    """One decode step of ``active`` sequences at ``context`` tokens: weights + KV read, or the FLOPs."""
    m = w.model
    memory = (m.weight_bytes + active * context * m.kv_bytes_per_token) / (tp * device.mem_bw * eff.bw)
    compute = 2 * m.params * active / (tp * device.flops * eff.decode_mfu)
    return max(memory, compute)


def generate_s(
    w: Workload, device: Device, devices: int, eff: Efficiency, *, streaming: bool = False
) -> float:
    """Prefill + decode of one step's batch on ``devices`` devices (engines of :func:`tensor_parallel`).

    Static batches (``streaming=False``, what a step-synchronous system and Tandem's workers do): an engine
    decodes at full concurrency while it has queued work, then its last wave drains — the active share
    follows the length distribution's survival function until the longest of the batch is done, so the
    long tail costs whole weight reads for few sequences. ``streaming=True`` (partial rollouts, continuous
    batching across steps, as AReaL): the engine stays full, the batch costs its tokens at full concurrency.
    """
    tp = tensor_parallel(w.model, device)
    engines = devices // tp
    if engines < 1:
        return math.inf
    per_engine = math.ceil(w.samples_per_step / engines)
    dist = w.completion
    mean = dist.capped_mean
    prompts = math.ceil(per_engine / max(1, w.group_size))
    prefill = 2 * w.model.params * prompts * w.prompt_len / (tp * device.flops * eff.prefill_mfu)
    conc = min(per_engine, eff.max_seqs, kv_capacity(w.model, device, tp, w.prompt_len + mean))
    full_ctx = w.prompt_len + mean / 2
    if streaming:
        steps = per_engine * mean / conc
        return prefill + steps * _decode_step_s(w, device, tp, conc, full_ctx, eff)
    queued = max(0, per_engine - conc) * mean / conc  # steps at full concurrency before the last wave
    decode = queued * _decode_step_s(w, device, tp, conc, full_ctx, eff)
    longest = dist.expected_max(per_engine)
    chunk = max(1.0, longest / _CHUNKS)
    t = chunk / 2
    while t < longest:
        active = max(1.0, conc * dist.survival(t))
        decode += chunk * _decode_step_s(w, device, tp, active, w.prompt_len + t, eff)
        t += chunk
    return prefill + decode


def update_s(w: Workload, device: Device, devices: int, eff: Efficiency) -> float:
    """Forward + backward (6·N FLOPs per token) over the batch, ``update_epochs`` times."""
    flops = 6 * w.model.params * w.tokens_per_step * w.update_epochs
    return flops / (devices * device.flops * eff.train_mfu)


def logprob_s(w: Workload, device: Device, devices: int, eff: Efficiency) -> float:
    """Scoring passes (2·N FLOPs per token): the proximal/old policy, plus the reference when β > 0."""
    passes = 1 + int(w.reference)
    return passes * 2 * w.model.params * w.tokens_per_step / (devices * device.flops * eff.forward_mfu)


def weight_sync_s(model: ModelShape, device: Device, *, cross_node: bool, eff: Efficiency) -> float:
    """Broadcast the bf16 weights from the trainer to the engines: over the network between nodes (a
    node's NICs together), else over the intra-node link; plus a fixed latency."""
    bw = device.net_bw * device.per_node if cross_node else device.link_bw
    return eff.sync_latency_s + model.weight_bytes / (bw * eff.sync_bw)


def transfer_s(w: Workload, device: Device) -> float:
    """Token ids and behaviour log-probs (8 bytes a token) of the batch over one device's network share."""
    return w.tokens_per_step * 8 / device.net_bw


def colocated_phases(w: Workload, device: Device, devices: int, eff: Efficiency) -> PhaseTimes:
    """Every phase on all ``devices``, one after the other; the switch between engine and trainer
    (reshard + offload/reload) takes the place of a weight sync."""
    return PhaseTimes(
        generate=generate_s(w, device, devices, eff),
        reward=w.reward_s_per_sample * w.samples_per_step / devices,
        logprob=logprob_s(w, device, devices, eff),
        update=update_s(w, device, devices, eff),
        weight_sync=eff.switch_s,
    )


def decoupled_phases(
    w: Workload,
    device: Device,
    *,
    rollout_devices: int,
    train_devices: int,
    workers: int,
    eff: Efficiency,
    streaming: bool = False,
) -> PhaseTimes:
    """Rollout side: ``workers`` engines groups of ``rollout_devices // workers`` devices, each generating
    whole tickets (one step's batch); learner side: ``train_devices``. Weights cross nodes when the two
    sides do not share one."""
    per_worker = rollout_devices // max(1, workers)
    cross = rollout_devices + train_devices > device.per_node
    sync = weight_sync_s(w.model, device, cross_node=cross, eff=eff)
    return PhaseTimes(
        generate=generate_s(w, device, per_worker, eff, streaming=streaming),
        reward=w.reward_s_per_sample * w.samples_per_step / max(1, per_worker),
        logprob=logprob_s(w, device, train_devices, eff),
        update=update_s(w, device, train_devices, eff),
        weight_sync=sync - eff.sync_latency_s,  # the trainer's send; the engines' load pays the latency
        weight_load=eff.sync_latency_s,
        transfer=transfer_s(w, device),
    )
