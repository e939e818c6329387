"""Several annotators per pair: agreement statistics and aggregation into one preference.

Input rows: ``prompt``, ``response_a``, ``response_b`` and ``annotations`` — either a list of labels
(annotator i gave label i) or a ``{annotator: label}`` object; a label is ``"a"`` or ``"b"`` (which
response is better) or ``"tie"``. Aggregation turns a row into a TRL pair (``chosen``/``rejected``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tandem.errors import DataError

LABELS = ("a", "b", "tie")


def annotations_of(row: dict[str, Any], where: str) -> dict[str, str]:
    """``{annotator: label}`` of a row, validated (DataError naming ``where`` and the field)."""
    raw = row.get("annotations")
    if isinstance(raw, list):
        raw = {str(i): label for i, label in enumerate(raw)}
    if not isinstance(raw, dict) or not raw:
        raise DataError("'annotations' must be a non-empty list or object of labels", where=where)
    for annotator, label in raw.items():
        if label not in LABELS:
            raise DataError(
                f"annotation of '{annotator}' is {label!r}", where=where, hint=f"use one of {LABELS}"
            )
    return dict(raw)


def cohen_kappa(x: Sequence[str], y: Sequence[str]) -> float:
    """Cohen's kappa of two annotators over the same items: ``(p_o - p_e) / (1 - p_e)`` with ``p_o`` the
    observed agreement and ``p_e = sum_k p_x(k) p_y(k)`` chance agreement from the marginals.
    1.0 when both are constant and equal (no disagreement possible)."""
    if len(x) != len(y) or not x:
        raise DataError(
            f"cohen_kappa needs two equally long non-empty label lists, got {len(x)} and {len(y)}"
        )
    n = len(x)
    p_o = sum(a == b for a, b in zip(x, y, strict=True)) / n
    cx, cy = Counter(x), Counter(y)
    p_e = sum(cx[k] * cy[k] for k in set(cx) | set(cy)) / (n * n)
    return 1.0 if p_e == 1 else (p_o - p_e) / (1 - p_e)


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa for items rated by the same number ``m`` of raters; ``counts[i][k]`` = raters that
    put item i in category k. ``P_i = (sum_k n_ik^2 - m) / (m (m - 1))``, ``P_bar`` their mean,
    ``P_e = sum_k p_k^2`` with ``p_k`` the overall share of category k; kappa = ``(P_bar - P_e)/(1 - P_e)``."""
    if not counts:
        raise DataError("fleiss_kappa needs at least one item")
    m = sum(counts[0])
    if m < 2 or any(sum(row) != m for row in counts):
        raise DataError("fleiss_kappa needs the same number (>= 2) of ratings for every item")
    n, k = len(counts), len(counts[0])
    p_i = [(sum(c * c for c in row) - m) / (m * (m - 1)) for row in counts]
    p_bar = sum(p_i) / n
    p_k = [sum(row[j] for row in counts) / (n * m) for j in range(k)]
    p_e = sum(p * p for p in p_k)
    return 1.0 if p_e == 1 else (p_bar - p_e) / (1 - p_e)


@dataclass(frozen=True)
class AgreementReport:
    items: int
    raw_agreement: float  # fraction of items on which all annotators agree
    fleiss_kappa: float | None  # over items with the modal number of ratings
    pairwise_cohen: dict[str, float]  # "ann1|ann2" -> kappa over items both rated


def agreement(rows: Sequence[dict[str, Any]]) -> AgreementReport:
    """Agreement statistics of annotated rows (see the module docstring for the row shape)."""
    anns = [annotations_of(r, f"row {i}") for i, r in enumerate(rows)]
    unanimous = sum(len(set(a.values())) == 1 for a in anns)
    sizes = Counter(len(a) for a in anns)
    modal = sizes.most_common(1)[0][0] if sizes else 0
    table = [[list(a.values()).count(lab) for lab in LABELS] for a in anns if len(a) == modal]
    fk = fleiss_kappa(table) if modal >= 2 and table else None
    names = sorted({k for a in anns for k in a})
    pairwise: dict[str, float] = {}
    for i, u in enumerate(names):
        for v in names[i + 1 :]:
            both = [(a[u], a[v]) for a in anns if u in a and v in a]
            if both:
                pairwise[f"{u}|{v}"] = cohen_kappa([x for x, _ in both], [y for _, y in both])
    return AgreementReport(len(anns), unanimous / max(1, len(anns)), fk, pairwise)


def aggregate(
    rows: Sequence[dict[str, Any]],
    *,
    method: Literal["majority", "unanimous"] = "majority",
    min_agreement: float = 0.5,
) -> tuple[list[dict[str, Any]], int]:
    """Annotated rows -> TRL pair rows (``prompt``, ``chosen``, ``rejected``, ``agreement``) and the
    number dropped. ``majority``: keep when the winning label ("a"/"b") has a share > ``min_agreement``
    (ties and split votes dropped); ``unanimous``: keep only when every annotator agrees."""
    out: list[dict[str, Any]] = []
    dropped = 0
    for i, row in enumerate(rows):
        labels = list(annotations_of(row, f"row {i}").values())
        top, votes = Counter(labels).most_common(1)[0]
        share = votes / len(labels)
        ok = share == 1.0 if method == "unanimous" else share > min_agreement
        if top == "tie" or not ok:
            dropped += 1
            continue
        better, worse = ("response_a", "response_b") if top == "a" else ("response_b", "response_a")
        pair = {k: v for k, v in row.items() if k not in ("response_a", "response_b", "annotations")}
        pair.update(chosen=row[better], rejected=row[worse], agreement=share)
        out.append(pair)
    return out, dropped
