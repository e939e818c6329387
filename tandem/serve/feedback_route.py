"""The ``POST /v1/feedback`` body: a rating of one served completion, or a preference between two.

Checked field by field (a 400 or 404 naming the field), then stored durably in the server's feedback
store before the answer is sent; the rows become preference data (``tandem data export-feedback``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.serve.feedback import check_pair, check_rating
from tandem.serve.protocol import ApiError

if TYPE_CHECKING:
    from tandem.serve.state import ServerState


def store_feedback(state: ServerState, data: dict) -> dict:
    """``{"id", "rating", "index"?}`` rates one completion; ``{"id", "other_id", "preferred", "index"?,
    "other_index"?}`` picks the better of two completions (``preferred`` is one of the two ids), and
    ``{"id", "index", "other_index", "preferred"}`` the better of two choices of one response (``n`` > 1;
    ``preferred`` is the better one's index). Stored durably before answering."""
    if state.feedback is None:
        raise ApiError(
            404, "feedback is disabled (start the server with --feedback-db)", code="feedback_disabled"
        )
    rid = data.get("id")
    if not isinstance(rid, str):
        raise ApiError(400, "field 'id' (a response id) must be a string", param="id")
    found = state.feedback.lookup(rid)
    if found is None:
        raise ApiError(404, f"unknown response id '{rid}'", param="id", code="response_not_found")
    arm, prompts, texts = found
    index = _choice_index(data, "index", len(texts))
    common = {"response_id": rid, "prompt": prompts[index], "arm": arm, "choice_index": index}
    if "other_id" in data or "other_index" in data:
        row = _store_pair(state, data, common, found)
    else:
        try:
            rating = check_rating(data.get("rating"))
        except ValueError as err:
            raise ApiError(400, str(err), param="rating") from err
        row = state.feedback.add(**common, rating=rating, chosen=texts[index])
    state.metrics.inc("feedback_total", 1, "Feedback rows stored.", arm=arm)
    return {"id": row, "object": "feedback", "stored": True}


def _store_pair(state: ServerState, data: dict, common: dict, found: tuple[str, list[str], list[str]]) -> int:
    """Store the pairwise choice of ``data``: completion ``index`` of response ``id`` (``common``, ``found``)
    against completion ``other_index`` of response ``other_id`` (``id`` when absent: two choices of one
    response)."""
    rid, index = common["response_id"], common["choice_index"]
    other = data.get("other_id", rid)
    if not isinstance(other, str):
        raise ApiError(400, "field 'other_id' (a response id) must be a string", param="other_id")
    if "rating" in data:  # one body is one kind of feedback: a rating would be dropped silently
        raise ApiError(400, "send a rating or a pair (other_id, preferred), not both", param="rating")
    other_found = found if other == rid else state.feedback.lookup(other)
    if other_found is None:
        raise ApiError(404, f"unknown response id '{other}'", param="other_id", code="response_not_found")
    _, other_prompts, other_texts = other_found
    other_index = _choice_index(data, "other_index", len(other_texts))
    if other_prompts[other_index] != common["prompt"]:
        raise ApiError(400, "the two completions answer different prompts", param="other_id")
    mine, theirs = found[2][index], other_texts[other_index]
    try:
        check_pair(rid, other, mine, theirs, index, other_index)
    except ValueError as err:
        raise ApiError(400, str(err), param="other_index" if other == rid else "other_id") from err
    preferred = data.get("preferred")
    if other == rid:  # one id names both: the better completion is named by its choice index
        if isinstance(preferred, bool) or preferred not in (index, other_index):
            raise ApiError(
                400,
                f"for two choices of one response, 'preferred' must be the better one's index ({index} or "
                f"{other_index})",
                param="preferred",
            )
        mine_wins, preferred = preferred == index, rid
    else:
        if preferred not in (rid, other):
            raise ApiError(400, "'preferred' must equal 'id' or 'other_id'", param="preferred")
        mine_wins = preferred == rid
    chosen, rejected = (mine, theirs) if mine_wins else (theirs, mine)
    return state.feedback.add(
        **common,
        other_id=other,
        other_index=other_index,
        preferred=preferred,
        chosen=chosen,
        rejected=rejected,
    )


def _choice_index(data: dict, key: str, choices: int) -> int:
    """``data[key]`` (0 when absent) as the index of one of a response's ``choices``; a 400 naming ``key``."""
    index = data.get(key, 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < choices:
        raise ApiError(400, f"'{key}' must be an integer in [0, {choices})", param=key)
    return index
