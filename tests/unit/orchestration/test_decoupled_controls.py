"""Sampling controls a decoupled learner publishes with the weights (``rollout.adaptive_temperature``): they
travel through the weight channel whole, never reach the engine's weights, follow in-flight updates to the
next batch, and the learner's controller moves only on batches it trains."""

from __future__ import annotations

import dataclasses

import torch

from tandem.algos import AdaptiveEntropy, PromptStats, TableStats
from tandem.channels.base import TrajectoryMessage
from tandem.channels.weights import SharedMemoryWeights
from tandem.models import load_causal_lm, load_tokenizer
from tandem.orchestration.decoupled.controls import (
    PROMPT_STATS,
    TEMPERATURE,
    LearnerControls,
    LearnerCurriculum,
    LearnerTemperature,
    control_tensors,
    scalar_control,
    split_controls,
)
from tandem.orchestration.decoupled.learner import ChannelWeights
from tandem.orchestration.decoupled.worker import InFlightSync, load_newest
from tandem.rollout import HFEngine, SamplingParams


def _temperature(value=1.0):
    return LearnerTemperature(AdaptiveEntropy(value, target=100.0, step=0.1, max_value=2.0, min_value=0.5))


def test_split_controls_round_trip():
    state = {"w": torch.ones(2), **control_tensors({TEMPERATURE: 1.3})}
    weights, controls = split_controls(state)
    assert list(weights) == ["w"] and list(controls) == [TEMPERATURE]
    assert scalar_control(controls, TEMPERATURE) == 1.3 and scalar_control(controls, PROMPT_STATS) is None
    assert split_controls({"w": torch.ones(2)})[1] == {}


class _Streaming:
    """A learner that keeps no whole policy: its tensors come one at a time (an FSDP2 rank 0)."""

    def __init__(self, state):
        self.state = state

    def weights(self):
        return iter(self.state.items())


def test_the_temperature_travels_with_the_weights_and_skips_the_engine(tiny_model_dir):
    engine = HFEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), version=0)
    policy = load_causal_lm(tiny_model_dir)
    temperature = _temperature()
    controls_out = LearnerControls(temperature=temperature, curriculum=LearnerCurriculum(5))
    template = {**policy.state_dict(), **controls_out.tensors()}
    channel = SharedMemoryWeights(template)
    try:
        for publisher in (
            ChannelWeights(channel, None, controls_out),
            ChannelWeights(channel, _Streaming(policy.state_dict()), controls_out),
        ):
            temperature.controller.value += 0.2
            controls_out.curriculum.stats.observe(3, 0.5, False)
            version = engine.version + 1
            publisher.publish(policy, version)
            controls = load_newest(engine, channel)
            assert scalar_control(controls, TEMPERATURE) == temperature.controller.value
            assert engine.version == version
            stats = TableStats(controls[PROMPT_STATS])
            assert stats.records == controls_out.curriculum.stats.records  # the learner's, whole
            assert not any(k.startswith("__tandem__") for k in engine.model.state_dict())
        assert load_newest(engine, channel) is None  # nothing newer
        # in flight: the controls of an update loaded mid-generation are kept for the next batch
        sync = InFlightSync(engine, channel)
        temperature.controller.value = 0.7
        ChannelWeights(channel, None, controls_out).publish(policy, engine.version + 1)
        engine.generate(
            ["1+2="], SamplingParams(max_new_tokens=6, temperature=1.0, seed=0), on_chunk=sync, chunk_tokens=1
        )
        assert sync.updates == 1 and scalar_control(sync.controls, TEMPERATURE) == 0.7
    finally:
        channel.unlink()


def test_learner_temperature_steps_on_batches_with_samples(tiny_model_dir):
    engine = HFEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), version=0)
    batch = engine.generate(["1+2=", "3+4="], SamplingParams(n=2, max_new_tokens=4, temperature=1.0, seed=0))
    temperature = _temperature()
    temperature.observe(batch.select([]))  # dynamic sampling kept no group: no step
    assert temperature.controller.value == 1.0
    temperature.observe(batch)  # entropy below the unreachable target: one step hotter
    assert temperature.controls() == {TEMPERATURE: 1.1}
    state = temperature.state_dict()
    temperature.controller.value = 1.5
    temperature.load_state_dict(state)  # a resume or a rollback
    assert temperature.controls() == {TEMPERATURE: 1.1}


def test_learner_curriculum_replays_worker_reports_and_checkpoints():
    """The learner's statistics are the workers' reports replayed in training order; the table published
    with the weights rebuilds them exactly, and a checkpoint restores them."""
    reports = [
        {"drawn": [0, 2], "observed": [[0, 1.0, True], [2, 0.25, False]]},
        {"drawn": [2, 4, 0], "observed": [[2, 0.5, False], [4, 0.0, True], [0, 1.0, True]]},
    ]
    direct = PromptStats()
    for r in reports:
        direct.drawn(r["drawn"])
        for key, mean, equal in r["observed"]:
            direct.observe(key, mean, equal)
    controls = LearnerControls(curriculum=LearnerCurriculum(5))
    for r in reports:
        controls.observe(TrajectoryMessage(batch=None, scores=None, ticket=0, worker_id=0, curriculum=r))
    assert controls.curriculum.stats.records == direct.records
    assert controls.curriculum.stats.get(0).streak == 2 and controls.curriculum.stats.frontier() == [2]
    table = controls.tensors()[PROMPT_STATS]
    assert table.shape == (4, 5) and TableStats(table).records == direct.records
    restored = LearnerControls(curriculum=LearnerCurriculum(5))
    restored.load_state_dict(controls.state_dict())
    assert restored.curriculum.stats.records == direct.records
    controls.observe(
        TrajectoryMessage(batch=None, scores=None, ticket=1, worker_id=1)
    )  # no report: no change
    assert controls.curriculum.stats.records == direct.records


def test_the_learner_replays_the_reports_of_stale_batches_too(tiny_model_dir):
    """A batch dropped as too stale was still generated and scored: its curriculum report reaches the
    learner's statistics (the temperature does not step on it); the trained batch's report follows."""
    import time

    from tandem.channels.queue import QueueChannel
    from tandem.orchestration.decoupled.coordination import AdmissionState
    from tandem.orchestration.decoupled.learner import ChannelSource
    from tandem.orchestration.decoupled.ledger import TicketLedger
    from tandem.orchestration.staleness import StalenessController

    engine = HFEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), version=0)
    batch = engine.generate(["1+2="], SamplingParams(n=2, max_new_tokens=3, temperature=1.0, seed=0))
    controller = StalenessController(0, 2)  # η = 0: a version-0 batch is stale for a version-1 learner
    controls = LearnerControls(temperature=_temperature(), curriculum=LearnerCurriculum(4))
    channel = QueueChannel()
    source = ChannelSource(
        channel,
        AdmissionState.in_memory(controller),
        controller,
        ledger=TicketLedger(),
        poll_workers=lambda: None,
        timeout_s=10.0,
        controls=controls,
    )
    stale = {"drawn": [1], "observed": [[1, 1.0, True]]}
    fresh = {"drawn": [2], "observed": [[2, 0.5, False]]}
    for ticket, version, report in ((0, 0, stale), (1, 1, fresh)):
        b = dataclasses.replace(batch, policy_version=torch.full((batch.batch_size,), version))
        channel.put(TrajectoryMessage(b, torch.zeros(2), ticket, 0, curriculum=report))
    time.sleep(0.2)  # the queue's feeder thread
    scored = source.next_batch(step=1, version=1)
    assert int(scored.batch.policy_version[0]) == 1 and source.ledger.dropped_samples == 2
    stats = controls.curriculum.stats
    assert stats.get(1).streak == 1 and stats.get(2).groups == 1  # both reports, the stale one too
    assert controls.temperature.controller.value == 1.1  # stepped once: on the trained batch only
