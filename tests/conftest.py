"""Shared fixtures: offline HF, quiet transformers, a tiny model folder built once per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Run every test on one torch thread: tiny models are no faster on two, and when the other core is
    busy (xdist workers, other jobs) OpenMP spin-waiting makes two-thread matmuls up to ~10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny char-level Llama (hidden 32, 2 layers) saved as an ordinary HF folder."""
    from tandem.models import init_tiny_model

    return init_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny", hidden_size=32, num_layers=2, num_heads=2, seed=0
    )


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on a free loopback port with bucket 'prefs'; env points fsspec/boto at it and
    Tandem's cache of remote copies (``TANDEM_CACHE``) at a temp folder. Yields the fsspec S3 filesystem."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    mp = pytest.MonkeyPatch()
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1", "TANDEM_CACHE": str(tmp_path_factory.mktemp("tandem-cache")),
    }.items():  # fmt: skip
        mp.setenv(key, value)
    import fsspec

    fs, _ = fsspec.core.url_to_fs("s3://prefs", client_kwargs={"endpoint_url": endpoint})
    if not fs.exists("prefs"):  # moto keeps its buckets in-process: an earlier module's server made it
        fs.mkdir("prefs")
    yield fs
    fsspec.filesystem("s3").clear_instance_cache()
    mp.undo()
    server.stop()


# What a skipped test needs, matched against its skip reason, and how to get it. `make test` ends with this
# table so a green run that skipped the Redis, Chromium or CUDA tests says so instead of hiding it.
_HOW_TO_GET = (
    ("extra is not installed", "an optional extra", "make test installs the dev extra; see pyproject.toml"),
    ("could not import", "an optional package", "make test installs the dev extra; see pyproject.toml"),
    ("redis", "Redis tests", "apt-get install redis-server (`bash .ci/run` installs it when run as root)"),
    ("chromium", "HTML-report rendering", "apt-get install chromium (`bash .ci/run` installs it as root)"),
    ("openssl", "TLS serving", "apt-get install openssl (`bash .ci/run` installs it as root)"),
    ("cuda", "GPU tests", "an NVIDIA GPU with a CUDA build of torch; never available in CI"),
)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A closing table: each distinct skip reason, how many tests it skipped, and how to get them run."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    for report in skipped:
        reason = _skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.section("skipped tests: what they need and how to get it", sep="-")
    for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        what, how = next(
            ((w, h) for key, w, h in _HOW_TO_GET if key in reason.lower()), ("", "see the reason")
        )
        terminalreporter.write_line(f"{n:4d} skipped  {reason}" + (f"  [{what}: {how}]" if what else ""))
