"""``tandem serve`` refuses a bad flag, a port it cannot bind and a feedback database it cannot open with
one line naming the flag and exit status 2, before any model loads and before anything is announced;
``--port 0`` announces the port it picked."""

from __future__ import annotations

import socket
import sqlite3
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")

from tandem.cli.main import app  # noqa: E402
from tandem.errors import ConfigError  # noqa: E402
from tandem.serve import server as serve_server  # noqa: E402
from tandem.serve.server import bind_port, build_state, open_feedback  # noqa: E402
from tandem.serve.state import ServeSettings  # noqa: E402


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if the CLI gets as far as loading a model or starting a server."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    for name in ("build_state", "run_server", "run_replicas"):
        monkeypatch.setattr(serve_server, name, loaded)


def _serve(*args: str):
    return CliRunner().invoke(app, ["serve", "some/model", *args])


def _one_error_line(result, flag: str) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}:"), result.output
    assert "Traceback" not in result.output and "serving" not in result.output
    return lines[0]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--max-batch-size", "0"], "--max-batch-size"),
        (["--max-queue", "0"], "--max-queue"),
        (["--max-wait-ms", "-5"], "--max-wait-ms"),
        (["--max-wait-ms", "nan"], "--max-wait-ms"),
        (["--cache-size", "-1"], "--cache-size"),
        (["--max-tokens-limit", "0"], "--max-tokens-limit"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--workers", "0"], "--workers"),
        (["--threads", "-1"], "--threads"),
        (["--port", "99999"], "--port"),
        (["--port", "-1"], "--port"),
    ],
)
def test_bad_flag_is_one_line_before_the_model_loads(no_load, args, flag):
    _one_error_line(_serve(*args), flag)


def test_feedback_db_that_is_a_folder(no_load, tmp_path):
    line = _one_error_line(_serve("--feedback-db", str(tmp_path)), "--feedback-db")
    assert "directory" in line


def test_port_in_use_is_one_line_before_the_model_loads(no_load):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _one_error_line(_serve("--port", str(port)), "--port")
        assert f"127.0.0.1:{port} is already in use" in line
        _one_error_line(_serve("--port", str(port), "--workers", "2"), "--port")


def test_port_0_announces_the_port_it_bound(monkeypatch):
    served = {}
    state = SimpleNamespace(name="m", router=SimpleNamespace(split={"main": 1.0}))
    monkeypatch.setattr(serve_server, "build_state", lambda *a, **k: state)

    def run_server(state, host, port, *, sock, **kwargs):
        served.update(port=port, bound=sock.getsockname()[1])

    monkeypatch.setattr(serve_server, "run_server", run_server)
    result = _serve("--port", "0")
    assert result.exit_code == 0, result.output
    assert served["port"] == served["bound"] != 0
    assert f"http://127.0.0.1:{served['port']}" in result.output


def test_bind_port_hands_over_a_bound_socket():
    with bind_port("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        assert port != 0
        with pytest.raises(ConfigError, match=f"--port: 127.0.0.1:{port} is already in use"):
            sock.listen()
            bind_port("127.0.0.1", port)
    with pytest.raises(ConfigError, match="--port: must be 0..65535"):
        bind_port("127.0.0.1", 65536)


def test_feedback_db_is_opened_before_the_models_load(monkeypatch, tmp_path):
    """A file that is not a database: refused by SQLite, which build_state asks first."""
    bad = tmp_path / "notes.txt"
    bad.write_text("not a database, just text that is long enough to be read as a header" * 20)
    with pytest.raises(ConfigError, match="--feedback-db: cannot open .* as a SQLite database"):
        open_feedback(str(bad))

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the feedback database was opened")

    monkeypatch.setattr(serve_server, "build_arm", loaded)
    with pytest.raises(ConfigError, match="--feedback-db"):
        build_state({"main": "some/model"}, ServeSettings(feedback_db=str(bad)))
    store = open_feedback(str(tmp_path / "new" / "fb.db"))  # a fresh file (and folder) is created
    store.close()
    assert sqlite3.connect(tmp_path / "new" / "fb.db").execute("PRAGMA schema_version").fetchone()


@pytest.mark.parametrize("command", ["export-feedback", "export-conversations"])
def test_a_feedback_export_never_writes_over_its_database(tmp_path, command):
    db = tmp_path / "fb.db"
    sqlite3.connect(db).close()
    before = db.read_bytes()
    result = CliRunner().invoke(app, ["data", command, str(db), "--out", str(db)])
    assert "--out" in _one_error_line(result, "--out") and "is the input" in result.output
    assert db.read_bytes() == before
    folder = CliRunner().invoke(app, ["data", command, str(db), "--out", str(tmp_path)])
    assert folder.exit_code == 2 and "is a folder" in folder.output


@pytest.mark.parametrize("command", ["export-feedback", "export-conversations"])
def test_a_feedback_export_only_reads_and_names_what_is_not_a_feedback_database(tmp_path, command):
    jsonl = tmp_path / "prefs.jsonl"
    jsonl.write_text('{"prompt": "1", "chosen": "2", "rejected": "3"}\n')
    other = tmp_path / "other.db"  # a SQLite file of something else: it used to gain the feedback tables
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    for db, said in ((jsonl, "file is not a database"), (other, "not a database that tandem serve")):
        result = CliRunner().invoke(app, ["data", command, str(db), "--out", str(tmp_path / "out.jsonl")])
        assert f"{db}: cannot export" in _one_error_line(result, str(db)) and said in result.output
    assert other.read_bytes() == before and not (tmp_path / "out.jsonl").exists()
    folder = CliRunner().invoke(app, ["data", command, str(tmp_path), "--out", str(tmp_path / "o.jsonl")])
    assert "is a folder, not a feedback database" in _one_error_line(folder, str(tmp_path))


def test_a_non_finite_export_threshold_is_refused(tmp_path):
    db = tmp_path / "fb.db"
    open_feedback(str(db)).close()
    result = CliRunner().invoke(
        app, ["data", "export-feedback", str(db), "--out", str(tmp_path / "o.jsonl")] + ["--threshold", "nan"]
    )
    assert "--threshold: must be a finite number" in _one_error_line(result, "--threshold")
