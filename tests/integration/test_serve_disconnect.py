"""A client that hangs up while its request waits in a batch gets its row cancelled (a real uvicorn server
on 127.0.0.1 and raw sockets): the route waits for the ASGI ``http.disconnect`` message instead of
polling, and a client that stays connected is answered as before."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("uvicorn")


def test_a_hung_up_client_cancels_its_row_and_others_are_answered(tiny_model_dir, monkeypatch):
    import uvicorn

    import tandem.serve.engines as engines
    from tandem.serve.server import build_state, make_app
    from tandem.serve.state import ServeSettings

    seen: list[list[bool]] = []
    decode = engines.decode_rows

    def slow_decode(model, tokenizer, rows, *args, **kwargs):  # the real decoder, after a pause
        time.sleep(0.8)
        seen.append([row.cancelled() for row in rows])
        return decode(model, tokenizer, rows, *args, **kwargs)

    monkeypatch.setattr(engines, "decode_rows", slow_decode)
    state = build_state({"main": str(tiny_model_dir)}, ServeSettings(max_batch_size=4, max_wait_ms=5), "t")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(state), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 20
        while not server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        body = json.dumps({"prompt": "1+2=", "max_tokens": 3}).encode()
        head = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection(("127.0.0.1", port)) as gone:
            gone.sendall(request)
            time.sleep(0.2)  # its row is generating (the decoder pauses 0.8 s); hang up
        with socket.create_connection(("127.0.0.1", port), timeout=30) as kept:
            kept.sendall(request)
            assert kept.recv(64).startswith(b"HTTP/1.1 200")
        assert seen == [[True], [False]]
    finally:
        server.should_exit = True
        thread.join(timeout=20)
