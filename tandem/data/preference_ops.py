"""Operations on preference pairs: dedup (exact and near), seeded split by prompt, stats, rebalancing,
and a user augmentation hook. All are deterministic given their seed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import random
import re
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tandem.data.preference import PreferencePair, render
from tandem.errors import ConfigError, DataError

_MERSENNE = (1 << 61) - 1


def _normalise(text: str) -> str:
    """Lower case, whitespace collapsed: what near-duplicate detection compares."""
    return re.sub(r"\s+", " ", text.lower()).strip()


def pair_key(pair: PreferencePair) -> str:
    """Exact identity of a pair (prompt, chosen, rejected) as canonical JSON."""
    return json.dumps([pair.prompt, pair.chosen, pair.rejected], sort_keys=True, ensure_ascii=False)


def prompt_key(pair: PreferencePair) -> str:
    """Identity of a pair's prompt (whitespace-normalised), the unit the train/validation split uses."""
    return _normalise(render(pair.prompt))


def _shingles(text: str, k: int) -> set[str]:
    text = _normalise(text)
    return {text[i : i + k] for i in range(max(1, len(text) - k + 1))}


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, len(a | b))


def _minhash(shingles: set[str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signature ``[H]`` uint64: min over shingles of ``(a*x + b) mod p`` per hash function."""
    xs = np.array(
        [int.from_bytes(hashlib.blake2b(s.encode(), digest_size=7).digest(), "big") for s in shingles],
        dtype=object,
    )
    values = (np.outer(a, xs) + b[:, None]) % _MERSENNE  # [H, S] python ints
    return values.min(axis=1).astype(np.uint64)


@dataclass(frozen=True)
class DedupResult:
    kept: list[PreferencePair]
    exact: list[PreferencePair]  # removed as exact duplicates
    near: list[PreferencePair]  # removed as near duplicates (Jaccard >= threshold)


def dedup(
    pairs: Sequence[PreferencePair],
    *,
    near_threshold: float | None = 0.9,
    shingle: int = 5,
    num_hashes: int = 32,
    bands: int = 16,
    seed: int = 0,
) -> DedupResult:
    """Drop exact duplicates, then near duplicates: pairs whose ``prompt + chosen + rejected`` character
    ``shingle``-grams have Jaccard similarity ≥ ``near_threshold`` with an earlier kept pair.

    Candidates come from MinHash LSH (``bands`` bands of ``num_hashes / bands`` rows) and every candidate
    is confirmed with the exact Jaccard, so no false positives; naive equivalent: compare all pairs,
    O(n²). The first occurrence is kept. ``near_threshold=None`` does exact dedup only.
    """
    seen: set[str] = set()
    kept: list[PreferencePair] = []
    exact: list[PreferencePair] = []
    for p in pairs:
        key = pair_key(p)
        (exact if key in seen else kept).append(p)
        seen.add(key)
    if near_threshold is None:
        return DedupResult(kept, exact, [])
    if not 0 < near_threshold <= 1 or num_hashes % bands:
        raise ConfigError("near_threshold must be in (0, 1] and num_hashes a multiple of bands")
    rng = np.random.default_rng(seed)
    a = np.array([int(x) for x in rng.integers(1, _MERSENNE, num_hashes, dtype=np.int64)], dtype=object)
    b = np.array([int(x) for x in rng.integers(0, _MERSENNE, num_hashes, dtype=np.int64)], dtype=object)
    rows = num_hashes // bands
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    final: list[PreferencePair] = []
    final_sh: list[set[str]] = []
    near: list[PreferencePair] = []
    for p in kept:
        sh = _shingles(render(p.prompt) + "\x00" + render(p.chosen) + "\x00" + render(p.rejected), shingle)
        sig = _minhash(sh, a, b)
        keys = [(band, sig[band * rows : (band + 1) * rows].tobytes()) for band in range(bands)]
        candidates = {j for key in keys for j in buckets.get(key, [])}
        if any(_jaccard(sh, final_sh[j]) >= near_threshold for j in candidates):
            near.append(p)
            continue
        for key in keys:
            buckets[key].append(len(final))
        final.append(p)
        final_sh.append(sh)
    return DedupResult(final, exact, near)


def split_by_prompt(
    pairs: Sequence[PreferencePair], *, val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Seeded train/validation split in which all pairs of one prompt land on the same side.

    Distinct prompts are shuffled with ``seed`` and the first ``round(val_fraction * n_prompts)`` go to
    validation (at least one when there are two or more prompts and the fraction is > 0).
    """
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction}")
    prompts = sorted({prompt_key(p) for p in pairs})
    random.Random(seed).shuffle(prompts)
    n_val = round(val_fraction * len(prompts))
    if val_fraction > 0 and n_val == 0 and len(prompts) > 1:
        n_val = 1
    val_prompts = set(prompts[:n_val])
    train = [p for p in pairs if prompt_key(p) not in val_prompts]
    val = [p for p in pairs if prompt_key(p) in val_prompts]
    return train, val


def _length_summary(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "max": 0.0}
    return {"mean": statistics.fmean(values), "p50": float(statistics.median(values)), "max": max(values)}


def preference_stats(pairs: Sequence[PreferencePair], *, length_fn: Callable[[str], int] = len) -> dict:
    """Counts, lengths (prompt / chosen / rejected), margin summary, category balance, and how often the
    chosen completion is the longer one (a common annotator bias a reward model can exploit)."""
    chosen_len = [length_fn(render(p.chosen)) for p in pairs]
    rejected_len = [length_fn(render(p.rejected)) for p in pairs]
    margins = [p.margin for p in pairs if p.margin is not None]
    longer = sum(c > r for c, r in zip(chosen_len, rejected_len, strict=True))
    return {
        "pairs": len(pairs),
        "prompts": len({prompt_key(p) for p in pairs}),
        "length/prompt": _length_summary([length_fn(render(p.prompt)) for p in pairs]),
        "length/chosen": _length_summary(chosen_len),
        "length/rejected": _length_summary(rejected_len),
        "chosen_longer_fraction": longer / len(pairs) if pairs else 0.0,
        "margin": _length_summary([int(m) for m in margins]) | {"count": len(margins)} if margins else None,
        "categories": dict(Counter(p.category or "(none)" for p in pairs).most_common()),
    }


def rebalance(
    pairs: Sequence[PreferencePair], *, seed: int = 0, target: int | None = None
) -> list[PreferencePair]:
    """Resample categories (``PreferencePair.category``) to equal counts: each category is oversampled
    with replacement up to ``target`` (default: the largest category's count); categories already
    larger than ``target`` are subsampled without replacement. Output order is seeded-shuffled."""
    groups: dict[str, list[PreferencePair]] = defaultdict(list)
    for p in pairs:
        groups[p.category or "(none)"].append(p)
    if not groups:
        return []
    goal = target if target is not None else max(len(g) for g in groups.values())
    rng = random.Random(seed)
    out: list[PreferencePair] = []
    for name in sorted(groups):
        members = groups[name]
        if len(members) >= goal:
            out.extend(rng.sample(members, goal))
        else:
            out.extend(members + rng.choices(members, k=goal - len(members)))
    rng.shuffle(out)
    return out


def load_hook(spec: str) -> Callable[..., Any]:
    """A callable from ``package.module:function`` or ``./file.py:function`` (user augmentation hook)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(f"'{spec}' is not 'module:function' or 'file.py:function'", where="--augment")
    try:
        if target.endswith(".py"):
            path = Path(target).resolve()
            if not path.is_file():
                raise ConfigError("augmentation file does not exist", where=str(path))
            mod_spec = importlib.util.spec_from_file_location(f"_tandem_hook_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)  # type: ignore[arg-type]
            sys.modules[mod_spec.name] = module  # type: ignore[union-attr]
            mod_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(target)
    except ImportError as err:
        raise ConfigError(f"cannot import '{target}': {err}", where="--augment") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"'{attr}' is not a callable in '{target}'", where="--augment")
    return fn


def augment(pairs: Sequence[PreferencePair], hook: Callable[..., Any]) -> list[PreferencePair]:
    """Apply a user hook ``hook(row: dict) -> dict | list[dict] | None`` to every pair (as a TRL row).

    A dict replaces the row, a list adds rows (e.g. paraphrases), None keeps the original. Returned rows
    are re-validated; call it on the train split only so validation measures real data.
    """
    from tandem.data.preference import InvalidRow, validate_row

    out: list[PreferencePair] = []
    for p in pairs:
        result = hook(dict(p.to_row()))
        rows = [p.to_row()] if result is None else [result] if isinstance(result, dict) else list(result)
        for i, row in enumerate(rows):
            checked = validate_row(row, f"{p.where} (augmented #{i})")
            if isinstance(checked, InvalidRow):
                raise DataError(
                    f"augmentation hook returned an invalid row: {checked.reason}", where=checked.where
                )
            out.append(replace(checked, where=p.where))
    return out
