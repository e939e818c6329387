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
    """``{"id", "rating", "index"?}`` rates one completion; ``{"id", "other_id", "preferred"}`` picks the
    better of two completions (``preferred`` is one of the two ids). Stored durably before answering."""
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
    index = data.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(texts):
        raise ApiError(400, f"'index' must be an integer in [0, {len(texts)})", param="index")
    common = {"response_id": rid, "prompt": prompts[index], "arm": arm, "choice_index": index}
    if "other_id" in data:
        other = data.get("other_id")
        if not isinstance(other, str):
            raise ApiError(400, "field 'other_id' (a response id) must be a string", param="other_id")
        if "rating" in data:  # one body is one kind of feedback: a rating would be dropped silently
            raise ApiError(400, "send a rating or a pair (other_id, preferred), not both", param="rating")
        other_found = state.feedback.lookup(other)
        if other_found is None:
            raise ApiError(404, f"unknown response id '{other}'", param="other_id", code="response_not_found")
        if other_found[1][0] != prompts[index]:
            raise ApiError(400, "the two responses answer different prompts", param="other_id")
        preferred = data.get("preferred")
        if preferred not in (rid, other):
            raise ApiError(400, "'preferred' must equal 'id' or 'other_id'", param="preferred")
        mine, theirs = texts[index], other_found[2][0]
        chosen, rejected = (mine, theirs) if preferred == rid else (theirs, mine)
        try:
            check_pair(rid, other, chosen, rejected)
        except ValueError as err:
            raise ApiError(400, str(err), param="other_id") from err
        row = state.feedback.add(
            **common, other_id=other, preferred=preferred, chosen=chosen, rejected=rejected
        )
    else:
        try:
            rating = check_rating(data.get("rating"))
        except ValueError as err:
            raise ApiError(400, str(err), param="rating") from err
        row = state.feedback.add(**common, rating=rating, chosen=texts[index])
    state.metrics.inc("feedback_total", 1, "Feedback rows stored.", arm=arm)
    return {"id": row, "object": "feedback", "stored": True}
