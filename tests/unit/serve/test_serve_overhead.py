"""The server's per-request shortcuts keep behaviour: prompts encoded through the tokenizer's Rust
backend give exactly what ``tokenizer(text)`` gives (else the Python path is kept), the rows' "all done"
future completes only when every row has, and the body-read deadline still fires."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")

from tandem.models import init_model, load_tokenizer  # noqa: E402
from tandem.serve.middleware import within_deadline  # noqa: E402
from tandem.serve.model import fast_encoder  # noqa: E402
from tandem.serve.routes import all_done  # noqa: E402

TEXTS = ["12+34=", "", "  a  b\tc\n", "caf\u00e9 \u2713", "<|im_end|>x", "Hello, world"]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_fast_encoder_matches_the_tokenizer_call(tmp_path, kind):
    folder = init_model(tmp_path / kind, tokenizer=kind, hidden_size=32, num_layers=1, num_heads=1)
    tok = load_tokenizer(folder)
    encode = fast_encoder(tok)
    assert encode is not None
    specials = list(tok.all_special_tokens)
    for text in [*TEXTS, *specials, "".join(specials)]:
        assert encode(text) == list(tok(text)["input_ids"]), text
    tok._tokenizer.enable_truncation(max_length=2)  # configured by someone else: the Python path decides
    assert encode("12+34=") == list(tok("12+34=")["input_ids"])
    assert tok._tokenizer.truncation is None  # ... and the Python call reset it, as before


def test_fast_encoder_declines_a_tokenizer_that_overrides_call(tmp_path):
    tok = load_tokenizer(init_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=1))

    class Custom(type(tok)):
        def __call__(self, text, **kwargs):  # e.g. a tokenizer adding its own prefix in Python
            return super().__call__("x" + text, **kwargs)

    tok.__class__ = Custom
    assert fast_encoder(tok) is None
    assert fast_encoder(object()) is None  # a slow (Python) tokenizer has no backend


def test_all_done_waits_for_every_row_and_cancelling_it_leaves_them():
    async def main():
        loop = asyncio.get_running_loop()
        rows = [loop.create_future() for _ in range(3)]
        done = all_done(rows)
        rows[0].set_result(1)
        rows[2].cancel()  # a cancelled row counts as finished
        await asyncio.sleep(0)
        assert not done.done()
        rows[1].set_result(2)
        await asyncio.wait_for(done, 1)
        other = [loop.create_future()]
        all_done(other).cancel()
        assert not other[0].cancelled()

    asyncio.run(main())


def test_within_times_out_and_passes_results():
    async def main():
        assert await within_deadline(asyncio.sleep(0, result="ok"), 1.0) == "ok"
        with pytest.raises(asyncio.TimeoutError):
            await within_deadline(asyncio.sleep(5), 0.01)

    asyncio.run(main())
