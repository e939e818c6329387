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
    torch._C.set_num_threads(1)  # torch.set_num_threads is a no-op once a vLLM engine ran on CPU
    yield
    torch._C.set_num_threads(before)


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


# The slowest scenarios (30-55 s each on 2 cores), marked `heavy`: `make test` leaves them out to stay under
# 15 minutes on 2 cores, `make test-all` runs them. Every real component keeps tests in `make test`: Ray
# (local run with actors, data-parallel learner actors), Redis (the channel suite), vLLM (both architectures),
# FSDP2, PEFT; what moves here are further fault and scaling scenarios of the same components.
HEAVY = {
    "tests/integration/test_ray_runtime.py::test_learner_actor_ctrl_c_and_user_error_on_a_joined_cluster",
    "tests/integration/test_ray_runtime.py::test_learner_actor_local_run_has_the_learner_resources_and_leaves_nothing",
    "tests/integration/test_ray_runtime.py::test_join_cluster_ctrl_c_and_user_error_leave_the_cluster_running",
    "tests/integration/test_ray_runtime.py::test_worker_actors_join_and_leave_mid_run",
    "tests/integration/test_ray_runtime.py::test_killed_worker_actor_is_restarted_and_the_run_finishes",
    "tests/e2e/test_rlhf_ppo_e2e.py::test_ppo_with_a_learned_reward_model_raises_refusals",
    "tests/integration/test_redis_channel.py::test_learner_crash_redelivers_unacknowledged_samples",
    "tests/integration/test_serve_hostile.py::test_admin_changes_reach_every_replica",
    "tests/integration/test_decoupled_equivalence.py::test_eta0_ppo_with_critic_and_adaptive_kl_equals_colocated",
    "tests/e2e/test_lora_e2e.py::test_two_rank_data_parallel_learner_trains_the_same_adapter",
    "tests/integration/test_dp_learner.py::test_two_rank_ppo_trains_its_critic_in_sync[shared_head]",
    "tests/integration/test_decoupled_faults.py::test_autoscaler_adds_a_worker_when_the_learner_starves",
    "tests/integration/test_decoupled_faults.py::test_workers_join_and_leave_mid_run",
    "tests/integration/test_decoupled_faults.py::test_keyboard_interrupt_stops_every_process",
    "tests/integration/test_decoupled_faults.py::test_killed_worker_is_restarted_and_the_run_finishes",
    "tests/integration/test_dp_learner.py::test_two_rank_learner_trains_in_sync_and_cleans_up",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the HEAVY scenarios; a name here that no longer exists is an error, so the list cannot rot."""
    found = set()
    for item in items:
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.heavy)
            found.add(item.nodeid)
    collected_files = {item.nodeid.split("::")[0] for item in items}
    missing = {n for n in HEAVY - found if n.split("::")[0] in collected_files}
    if missing:
        raise pytest.UsageError(f"tests/conftest.py HEAVY names tests that do not exist: {sorted(missing)}")
