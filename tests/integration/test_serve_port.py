"""``tandem serve`` as a shell runs it: ``--port 0`` serves where it says it does, and a second server
on that port stops at one ``error: --port: ...`` line, exit status 2, without announcing anything and
without uvicorn's log or interpreter-exit noise."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from console import TANDEM

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")


@pytest.mark.slow
def test_port_0_and_a_port_in_use(tiny_model_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    stdout, stderr = tmp_path / "out.txt", tmp_path / "err.txt"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [*TANDEM, "serve", str(tiny_model_dir), "--port", "0"], stdout=out, stderr=err, env=env
        )
    try:
        deadline, url = time.time() + 120, None
        while url is None and time.time() < deadline and proc.poll() is None:
            found = re.search(r"on (http://127\.0\.0\.1:(\d+))", stdout.read_text())
            url = found.group(1) if found else time.sleep(0.2)
        assert url is not None, stderr.read_text()[-800:]
        port = int(url.rsplit(":", 1)[1])
        assert port != 0
        while True:  # the announced port is the served one
            try:
                assert httpx.get(url + "/ready", timeout=1).status_code == 200
                break
            except httpx.HTTPError:
                assert time.time() < deadline and proc.poll() is None, stderr.read_text()[-800:]
                time.sleep(0.2)
        second = subprocess.run(
            [*TANDEM, "serve", str(tiny_model_dir), "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        assert second.stdout == ""  # nothing announced
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"error: --port: 127.0.0.1:{port} is already in use")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, stderr.read_text()[-800:]
    # Ctrl-C is a quiet stop: the heap frozen for serving is handed back, so no extension module reports
    # its objects as "leaked" at exit (triton's nanobind bindings printed ~30 such lines)
    assert "leaked" not in stderr.read_text(), stderr.read_text()[-800:]
