"""Server hardening: schema-driven fuzzing (no 5xx, every error OpenAI-shaped), pickle refusal, feedback
surviving kill -9, TLS, and the bounded load tester (replicas: test_serve_hostile.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tandem.errors import ConfigError, ModelError  # noqa: E402
from tandem.serve.loadtest import check_target, run_load  # noqa: E402
from tandem.serve.model import ServedModel  # noqa: E402
from tandem.serve.protocol import ChatRequest, CompletionRequest, PredictRequest  # noqa: E402
from tandem.serve.server import build_state  # noqa: E402
from tandem.serve.state import ServeSettings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from console import TANDEM  # noqa: E402
from test_serve_api import Running, _free_port  # noqa: E402

KEY = "k1"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = ServeSettings(
        max_batch_size=8,
        max_wait_ms=5,
        api_keys=[KEY],
        admin_key="adm",
        max_tokens_limit=8,
        max_n=2,
        max_prompts=2,
        max_body_bytes=2048,
    )
    running = Running(build_state({"main": str(tiny_model_dir)}, s, name="tiny"))
    yield running
    running.stop()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _bodies(model) -> st.SearchStrategy:
    """Objects whose keys come from the request schema (so validation paths are reached) with random
    values, plus arbitrary JSON and raw bytes."""
    fields = list(model.model_json_schema()["properties"])
    keyed = st.dictionaries(st.sampled_from(fields), json_values, max_size=len(fields))
    return keyed.map(json.dumps) | json_values.map(json.dumps) | st.binary(max_size=40).map(bytes.hex)


ENDPOINTS = [
    ("/v1/completions", CompletionRequest),
    ("/v1/chat/completions", ChatRequest),
    ("/predict", PredictRequest),
    ("/v1/feedback", PredictRequest),
    ("/admin/split", PredictRequest),
]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_no_5xx_and_errors_are_openai_shaped(server, data):
    path, model = data.draw(st.sampled_from(ENDPOINTS))
    body = data.draw(_bodies(model))
    key = data.draw(st.sampled_from([KEY, "adm", None]))
    headers = {"content-type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post(path, content=body.encode(), headers=headers)
    assert r.status_code < 500, (path, body, r.text)
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_openapi_paths_all_answer_without_5xx(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for route in server.server.config.app.routes:
            for method in getattr(route, "methods", set()) - {"HEAD"}:
                r = c.request(method, route.path, content=b"{}")
                assert r.status_code < 500, (method, route.path, r.text)


def _cli(args: list[str]):
    """Run the CLI in-process (the exit code and one-line error are what a shell would see)."""
    from typer.testing import CliRunner

    from tandem.cli.main import app

    return CliRunner().invoke(app, args)


def test_server_refuses_pickle_weights(tiny_model_dir, tmp_path):
    bad = tmp_path / "pickled"
    bad.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, bad / f.name)
    (bad / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(ModelError, match="refusing pickle"):
        ServedModel.load(bad)
    r = _cli(["serve", str(bad)])
    assert r.exit_code == 2 and "refusing pickle" in r.output and "Traceback" not in r.output


def test_unkeyed_server_refuses_public_bind(tiny_model_dir):
    r = _cli(["serve", str(tiny_model_dir), "--host", "0.0.0.0"])
    assert r.exit_code == 2 and "--host" in r.output


def _spawn(args: list[str], port: int, env: dict | None = None, wait_s: float = 240) -> subprocess.Popen:
    """`tandem serve ARGS` in its own process group, once /ready answers 200. stderr goes to a file (a
    pipe nobody reads fills up and blocks the server); on failure the whole group is killed, since a
    SIGKILLed parent leaves its uvicorn workers running."""
    with tempfile.TemporaryFile() as log:  # the child keeps its own descriptor once we close ours
        proc = subprocess.Popen(
            [*TANDEM, "serve", *args, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
            start_new_session=True,
        )
        deadline = time.time() + wait_s  # generous: replicas each import torch and load on a busy 2-CPU box
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.2)
            if proc.poll() is not None:
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.seek(0)
        raise AssertionError(f"server did not start: {log.read().decode(errors='replace')[-800:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop a server from :func:`_spawn` as Ctrl-C would; its whole group is killed if that hangs."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_feedback_survives_kill_9_and_exports(tiny_model_dir, tmp_path):
    db, port = tmp_path / "fb.db", _free_port()
    proc = _spawn([str(tiny_model_dir), "--feedback-db", str(db)], port)
    try:
        url = f"http://127.0.0.1:{port}"
        body = {"prompt": "3+4=", "max_tokens": 4, "seed": 0}
        a = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
        for seed in range(1, 20):  # a pair of identical answers is refused: sample until the texts differ
            b = httpx.post(url + "/v1/completions", json={**body, "seed": seed}, timeout=30).json()
            if b["choices"][0]["text"] != a["choices"][0]["text"]:
                break
        r = httpx.post(url + "/v1/feedback", json={"id": a["id"], "other_id": b["id"], "preferred": a["id"]})
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    out = tmp_path / "prefs.jsonl"
    r = subprocess.run(
        [*TANDEM, "data", "export-feedback", str(db), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"prompt": "3+4=", "chosen": a["choices"][0]["text"], "rejected": b["choices"][0]["text"]}
    ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_tls(tiny_model_dir, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    proc = subprocess.Popen(
        [
            *TANDEM,
            "serve",
            str(tiny_model_dir),
            "--port",
            str(port),
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline, status = time.time() + 60, None
        while time.time() < deadline and status != 200 and proc.poll() is None:
            try:
                status = httpx.get(f"https://127.0.0.1:{port}/ready", verify=str(cert), timeout=1).status_code
            except httpx.HTTPError:
                time.sleep(0.2)
        assert status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_loadtest_is_bounded_and_loopback_only(server):
    with pytest.raises(ConfigError, match="non-loopback"):
        check_target("http://10.1.2.3:8000", None)
    check_target("http://10.1.2.3:8000", "10.1.2.3")
    result = asyncio.run(
        run_load(
            server.url,
            concurrency=4,
            max_requests=12,
            duration_s=30,
            body={"prompt": "1+2=", "max_tokens": 3},
            api_key=KEY,
        )
    )
    assert result.requests == 12 and result.ok == 12 and result.errors_by_status == {}
    assert result.p50_ms <= result.p99_ms
    bad = asyncio.run(
        run_load(
            server.url, concurrency=2, max_requests=4, duration_s=30, body={"prompt": "1"}, api_key="wrong"
        )
    )
    assert bad.errors_by_status == {"401": 4}


@pytest.mark.slow
def test_exported_feedback_trains_with_tandem_dpo(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from tandem.cli.main import app
    from tandem.serve.feedback import FeedbackStore, export_preferences

    store = FeedbackStore(tmp_path / "fb.db")
    for i in range(10):
        store.remember(f"a{i}", "main", [f"{i}+1="], [f"{i + 1}"])
        store.add(
            response_id=f"a{i}",
            prompt=f"{i}+1=",
            arm="main",
            other_id=f"b{i}",
            preferred=f"a{i}",
            chosen=f"{i + 1}",
            rejected="x",
        )
    store.close()
    prefs = tmp_path / "prefs.jsonl"
    assert len(export_preferences(tmp_path / "fb.db", prefs)) == 10
    config = tmp_path / "dpo.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\nout_dir: {tmp_path / 'dpo'}\ndata:\n  train_file: {prefs}\n"
        "batch_size: 4\nmax_steps: 2\nwarmup_steps: 0\n"
    )
    result = CliRunner().invoke(app, ["dpo", str(config)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "dpo" / "model.safetensors").is_file()
