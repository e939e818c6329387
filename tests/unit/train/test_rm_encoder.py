"""Encoder reward models (BERT/RoBERTa sequence classifiers) beside the causal-LM heads: the kind is read
from the folder's config, a locally built tiny encoder loads offline with the Auto classes, scores are
padding invariant, Bradley–Terry training separates a preference set that is learnable by construction
(the chosen completion carries a marker word, the rejected one another), the saved folder round-trips,
the RL reward and the A/B judge re-tokenise the policy's text with the RM's own tokenizer, and a folder of
neither kind is refused in one line."""

from __future__ import annotations

import random

import pytest
import torch

from tandem.config.reward import RewardModelConfig
from tandem.data.preference import PreferencePair
from tandem.errors import ModelError
from tandem.models.encoder import build_tiny_encoder, reward_model_kind
from tandem.models.loading import load_tokenizer
from tandem.train import rm

WORDS = ["apple", "river", "stone", "cloud", "paper", "light", "green", "seven", "table", "music"]


def marker_pairs(n: int, seed: int) -> list[PreferencePair]:
    """Learnable by construction: the same body, ending in 'good' (chosen) or 'bad' (rejected)."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        pairs.append(
            PreferencePair(f"question {i}: say something", f"{body} good", f"{body} bad", where=f"{i}")
        )
    return pairs


def corpus() -> list[str]:
    return [f"{p.prompt} {p.chosen} {p.rejected}" for p in marker_pairs(64, 0)]


@pytest.fixture(scope="module", params=["bert", "roberta"])
def encoder_dir(request, tmp_path_factory):
    return build_tiny_encoder(tmp_path_factory.mktemp("enc") / request.param, corpus(), arch=request.param)


@pytest.fixture(scope="module")
def trained(encoder_dir, tmp_path_factory):
    model, tok = rm.load_reward_model(encoder_dir, init_head=True)
    train = marker_pairs(64, 0)
    settings = rm.RMSettings(epochs=10, lr=3e-3, batch_size=16)
    history = rm.train_reward_model(model, tok, train, marker_pairs(16, 1), settings)
    out = tmp_path_factory.mktemp("rm") / "rm"
    rm.save_reward_model(model, tok, out, rm.reward_stats(model, tok, train) | {"history": history})
    return model, tok, history, out


def test_kind_is_read_from_the_config(encoder_dir, tiny_model_dir):
    from transformers import AutoConfig

    assert reward_model_kind(AutoConfig.from_pretrained(encoder_dir)) == "encoder"
    assert reward_model_kind(AutoConfig.from_pretrained(tiny_model_dir)) == "causal"


def test_built_encoder_loads_offline_with_the_auto_classes(encoder_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(encoder_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        encoder_dir, num_labels=1, local_files_only=True
    )
    enc = tok("question 1:", "apple good", return_tensors="pt")
    assert model(**enc).logits.shape == (1, 1)
    assert tok.convert_ids_to_tokens(enc["input_ids"][0])[-3:] == ["apple", "good", tok.sep_token]


def test_encoder_scores_are_padding_invariant(encoder_dir):
    torch.manual_seed(0)  # the fresh head (and pooler) are drawn from the global RNG
    model, tok = rm.load_reward_model(encoder_dir, init_head=True)
    model.eval()
    # A fresh head's small weights make every score nearly the same (seen: 1.6e-7 apart); a unit-scale head
    # makes the scores depend on the text, so invariance to padding is not met by a constant.
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1][-1]
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0)))
    alone = rm.score_texts(model, tok, ["question 1:"], ["good"])
    batch = rm.score_texts(
        model, tok, ["question 1:", "question 2: a much longer prompt"], ["good", "apple river stone good"]
    )
    assert batch[0] == pytest.approx(alone[0], abs=1e-5) and abs(batch[1] - alone[0]) > 1e-4


def test_bradley_terry_training_separates_marker_pairs(trained):
    model, tok, history, _ = trained
    assert rm.pairwise_accuracy(model, tok, marker_pairs(64, 0)) > 0.9
    assert history[-1]["rm/val_accuracy"] > 0.9
    assert history[-1]["rm/loss"] < history[0]["rm/loss"] - 0.3  # ln 2 ≈ 0.69 at the start


def test_saved_encoder_rm_round_trips_as_a_classifier(trained):
    model, tok, _, out = trained
    loaded, tok2 = rm.load_reward_model(out)  # no init_head: it is a reward model now
    assert (
        loaded.config.architectures[0].endswith("ForSequenceClassification") and tok2.padding_side == "right"
    )
    texts = (["question 3:", "question 4:"], ["apple good", "stone bad"])
    assert rm.score_texts(loaded, tok2, *texts) == pytest.approx(rm.score_texts(model, tok, *texts), abs=1e-5)


def test_base_encoder_is_not_a_reward_model_without_init_head(encoder_dir):
    with pytest.raises(ModelError, match="not a reward model .*train one with `tandem rm`"):
        rm.load_reward_model(encoder_dir)


def test_rl_reward_retokenises_the_policy_text_with_the_rm_tokenizer(trained, tiny_model_dir):
    from tandem.train.rm import build_reward_model_reward

    _, _, _, out = trained
    prompts, completions = ["question 5: say something"] * 2, ["music good", "music bad"]
    rm_tok, policy_tok = load_tokenizer(out), load_tokenizer(tiny_model_dir)
    # the two vocabularies differ: policy ids fed to the RM would score other text (or fall off its table)
    assert rm_tok(prompts[0])["input_ids"] != policy_tok(prompts[0])["input_ids"]
    reward = build_reward_model_reward(RewardModelConfig(path=str(out), normalize="none", batch_size=1))
    model, tok = rm.load_reward_model(out)
    with torch.no_grad():
        enc = tok(prompts, completions, padding=True, return_tensors="pt")
        direct = model(**enc).logits[:, 0].tolist()
    scores = reward(prompts, completions)
    assert scores == pytest.approx(direct, abs=1e-5) and scores[0] > scores[1]
    chat = reward(
        [[{"role": "user", "content": prompts[0]}]], [[{"role": "assistant", "content": "music good"}]]
    )
    assert chat[0] > scores[1]  # conversational data: rendered, then re-tokenised the same way


def test_ab_judge_scores_an_encoder_rm_as_it_was_trained(trained):
    from tandem.evaluate.judges import RewardModelJudge

    model, tok, _, out = trained
    judge = RewardModelJudge(str(out), batch_size=2)
    prompts, answers = ["question 6:"] * 3, ["green good", "green bad", "paper light seven good"]
    assert judge.score(prompts, answers).tolist() == pytest.approx(
        rm.score_texts(model, tok, prompts, answers), abs=1e-5
    )
    assert judge.compare(prompts, ["green good"] * 3, ["green bad"] * 3, {}) == [-1, -1, -1]  # A wins


def test_a_folder_of_neither_kind_is_refused_in_one_line(tmp_path):
    from transformers import T5Config, T5ForConditionalGeneration, ViTConfig, ViTModel

    vit = ViTModel(
        ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    )
    vit.save_pretrained(tmp_path / "vit", safe_serialization=True)
    t5 = T5ForConditionalGeneration(
        T5Config(vocab_size=32, d_model=16, d_ff=16, d_kv=8, num_layers=1, num_heads=2)
    )
    t5.save_pretrained(tmp_path / "t5", safe_serialization=True)
    for name in ("vit", "t5"):
        with pytest.raises(
            ModelError, match=f"model type '{name}' is neither a causal LM nor an encoder"
        ) as err:
            rm.load_reward_model(tmp_path / name, init_head=True)
        assert "\n" not in str(err.value) and name in str(err.value)


def test_a_pair_longer_than_the_positions_is_truncated_not_an_error(encoder_dir):
    from tandem.models.encoder import encode_pairs

    model, tok = rm.load_reward_model(encoder_dir, init_head=True)
    long_prompt, long_answer = " ".join(WORDS * 20), " ".join(WORDS * 5) + " good"
    enc = encode_pairs(model, tok, [long_prompt, "q"], [long_answer, "a"])
    assert enc["input_ids"].shape[1] == 128  # build_tiny_encoder's max_length
    assert tok.convert_ids_to_tokens(enc["input_ids"][0])[-2:] == ["good", tok.sep_token]  # prompt cut first
    assert all(torch.isfinite(torch.tensor(rm.score_texts(model, tok, [long_prompt], [long_answer]))))
