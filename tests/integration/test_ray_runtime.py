"""The Ray runtime end to end (``architecture.runtime: ray``): rollout workers as Ray actors in a placement
group, weights through the object store, trajectories through the actor queue, the learner in the driver.

* a local run starts a private Ray instance, finishes, and leaves no process and no file behind;
* on a joined cluster (``architecture.ray.address``), Ctrl-C (KeyboardInterrupt in the driver) and a user
  error in a worker (its one-line message, no restart) each stop the run, remove its actors and leave the
  cluster running;
* a worker actor killed mid-run (on the joined cluster) is restarted by Ray and the run finishes with exact
  accounting;
* with ``architecture.ray.learner_actor`` the learner runs in an actor with the learner's resources (local
  instance: nothing left behind), and a data-parallel learner's other ranks are actors in the learner's
  placement group; on the joined cluster Ctrl-C in the driver stops it and every actor it
  made, and a worker's user error reaches the driver as its one line.

Every run is tiny (2 prompts × 4 samples, 4 new tokens). The module's cluster is started once with
``ray start --head`` in its own temp folder and stopped by killing exactly its processes (never
``ray stop``, which would stop every Ray instance of this user on the machine).
"""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from run_checks import check_accounting, step_rows

from tandem.config import build_config
from tandem.orchestration.decoupled.ray_learner import train_in_learner_actor
from tandem.orchestration.decoupled.runtime import RunHooks, train_decoupled
from tandem.orchestration.decoupled.supervisor import WorkerFailedError
from tandem.orchestration.runner import train

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
pytestmark = [pytest.mark.ray, pytest.mark.slow]
DIGITS = f"{Path(__file__).parents[1] / 'e2e' / 'digits_reward.py'}:digit_share"


def _cfg(model_dir, out, *, steps=3, reward=DIGITS, **arch):
    return build_config(
        {
            "run": {"output_dir": str(out), "seed": 3},
            "model": {"path": str(model_dir)},
            "data": {"task": "arith", "prompts_per_step": 2, "eval_size": 0, "train_size": 32},
            "rollout": {"n": 4, "max_new_tokens": 4},
            "reward": {"task_reward": False, "functions": [{"path": reward}]},
            "algorithm": {"name": "decoupled_ppo"},
            "trainer": {"total_steps": steps, "lr": 1e-3},
            "architecture": {
                "mode": "decoupled",
                "staleness": 1,
                "runtime": "ray",
                "channel": {"backend": "ray"},
                **arch,
            },
            "monitor": {"eval_every": 0, "sample_every": 0, "tensorboard": False, "progress": False},
        }
    )


def _pids_mentioning(text: str) -> set[int]:
    """Processes whose command line contains ``text`` (Ray's own processes name their temp folder)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def _children(pids: set[int]) -> set[int]:
    """``pids`` and all their descendants (Ray's worker processes rename themselves ``ray::...``)."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent_of[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = set(pids), True
    while grew:
        new = {p for p, pp in parent_of.items() if pp in tree and p not in tree}
        tree |= new
        grew = bool(new)
    return tree


def _alive(pid: int, grace_s: float = 10.0) -> bool:
    """True when ``pid`` still runs after ``grace_s`` seconds (a zombie counts as gone)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z" or time.monotonic() > deadline:
            return state != "Z"
        time.sleep(0.1)


@pytest.fixture
def short_tmp(monkeypatch):
    """A short temp root for Ray's folder (unix socket paths are limited to 107 characters)."""
    root = tempfile.mkdtemp(prefix="trt-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield Path(root)
    os.rmdir(root)  # fails the test if the run left anything in it


def test_local_run_uses_actors_and_leaves_nothing_behind(tiny_model_dir, tmp_path, short_tmp, s3):
    """Also: the policy comes from an s3:// folder (moto); the learner and the worker actor each use the
    machine's cached copy; the learner's adaptive sampling temperature reaches the worker actor through
    the object store with the weights."""
    from tandem.data import storage

    torch.set_num_threads(1)
    storage.upload(tiny_model_dir, "s3://prefs/models/ray-tiny")
    seen = {}

    def inspect(run, step):
        if step == 1:
            (ray_dir,) = list(short_tmp.iterdir())
            seen["ray_dir"] = ray_dir
            seen["procs"] = _children(_pids_mentioning(str(ray_dir)))
            seen["worker_pids"] = run.supervisor.pids()
            seen["resources"] = run.supervisor.assigned_resources()
            seen["pg"] = ray.util.placement_group_table(run.supervisor.placement_group)

    cfg = _cfg(
        "s3://prefs/models/ray-tiny",
        tmp_path / "run",
        ray={"num_cpus": 2},
        worker={"cpus": 1, "memory_mb": 200},
        learner={"cpus": 1},
    )
    data = cfg.model_dump(mode="json")  # a target no policy reaches: 0.1 hotter per trained batch
    data["rollout"]["adaptive_temperature"] = {"target_entropy": 100.0, "step": 0.1}
    cfg = build_config(data)
    result = train_decoupled(cfg, hooks=RunHooks(on_step=inspect))
    assert result.steps == 3
    assert len(list(storage.cache_root().iterdir())) == 1  # one cached copy, shared by learner and worker
    check_accounting(result, 3)
    rows = step_rows(result.run_dir)
    assert all(r["decoupled/workers_alive"] == 1 and r["staleness/step_lag"] <= 1 for r in rows)
    # the learner's publish into the object store is timed
    assert all(r["timing/weight_sync"] > 0 for r in rows)
    # ticket 2 is admitted only after batch 0 was trained and published (η = 1): it samples hotter
    temps = [r["rollout/temperature"] for r in rows]
    assert temps[0] == 1.0 and temps[2] >= 1.1 - 1e-9 and temps == sorted(temps)
    # per-role resources reached the actor; the placement group holds a worker and a learner bundle
    assert seen["resources"] == {0: {"CPU": 1.0, "memory": 200 * 2**20}}
    bundles = seen["pg"]["bundles"]
    assert seen["pg"]["state"] == "CREATED" and len(bundles) == 2
    assert bundles[0] == {"CPU": 1.0, "memory": 200 * 2**20}
    assert bundles[1]["CPU"] == 1.0 and any(k.startswith("node:") for k in bundles[1])
    # the instance was real (raylet, GCS, workers in its folder) and is gone: processes and files
    assert len(seen["procs"]) >= 3 and set(seen["worker_pids"]) <= seen["procs"]
    assert not any(_alive(pid) for pid in seen["procs"])
    assert not seen["ray_dir"].exists() and not ray.is_initialized()


def test_killed_worker_actor_is_restarted_and_the_run_finishes(tiny_model_dir, tmp_path, cluster):
    torch.set_num_threads(1)
    killed = []

    def kill_worker(run, step):
        if step == 1:
            killed.extend(run.supervisor.pids())
            ray.kill(run.supervisor.actors[0], no_restart=False)  # the process dies; Ray may restart it

    address, _ = cluster
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=4, ray={"address": address}, max_worker_restarts=2)
    result = train_decoupled(cfg, hooks=RunHooks(on_step=kill_worker))
    assert result.steps == 4 and killed
    rows = step_rows(result.run_dir)
    assert rows[-1]["decoupled/worker_restarts"] >= 1
    assert all(r["staleness/step_lag"] <= 1 for r in rows)
    check_accounting(result, 4)
    assert not _alive(killed[0])


def test_worker_actors_join_and_leave_mid_run(tiny_model_dir, tmp_path, cluster):
    """Elasticity on Ray: an actor added mid-run takes over when the first one is retired; the learner
    never stops, and the accounting stays exact. (Half-CPU workers so two fit beside the learner bundle.)"""
    torch.set_num_threads(1)
    events = {}

    def scale(run, step):
        if step == 1:
            events["added"] = run.supervisor.add_worker()
        if step == 2:
            events["removed"] = run.supervisor.remove_worker(0)

    address, _ = cluster
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=6, ray={"address": address}, worker={"cpus": 0.5})
    result = train_decoupled(cfg, hooks=RunHooks(on_step=scale))
    assert result.steps == 6 and events == {"added": 1, "removed": 0}
    rows = step_rows(result.run_dir)
    assert rows[-1]["decoupled/worker"] == 1.0, "the added actor's batches were trained"
    assert rows[-1]["decoupled/workers_alive"] == 1.0 and rows[-1]["decoupled/worker_restarts"] == 0
    check_accounting(result, 6)


BROKEN_REWARD = """
def broken(prompts, completions, **kw):
    raise ValueError("boom")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head_node():
    """``ray start --head`` on 127.0.0.1 in its own folder, shared by the module's cluster tests; stopped by
    killing exactly its processes."""
    port, root = _free_port(), Path(tempfile.mkdtemp(prefix="trt-", dir="/tmp"))
    ray_bin = Path(sys.executable).parent / "ray"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # a loopback-only test cluster
    cmd = [str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={root}"]
    cmd += ["--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
    procs = _pids_mentioning(str(root))
    yield f"127.0.0.1:{port}", procs
    tree = _children(_pids_mentioning(str(root)) | procs)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3  # gcs_server and the monitor ignore SIGTERM: then SIGKILL
    while time.monotonic() < deadline and any(_alive(pid, grace_s=0.0) for pid in tree):
        time.sleep(0.2)
    for pid in tree:
        if _alive(pid, grace_s=0.0):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(head_node, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the head was started
    return head_node


def _tandem_actors(root_pids: set[int]) -> set[int]:
    """Processes of the cluster that host one of Tandem's actors (Ray titles them ``ray::<Class>...``)."""
    names = ("ray::RolloutActor", "ray::CoordinatorActor", "ray::WeightRegistry", "ray::_QueueActor")
    names += ("ray::LearnerActor",)
    found = set()
    for pid in _children(root_pids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith(names):
            found.add(pid)
    return found


def _wait_until(condition, limit_s: float = 30.0) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    return condition()


def test_join_cluster_ctrl_c_and_user_error_leave_the_cluster_running(tiny_model_dir, tmp_path, cluster):
    torch.set_num_threads(1)
    address, head_procs = cluster
    seen = {}

    def interrupt(run, step):
        seen["actors"] = _tandem_actors(head_procs)
        raise KeyboardInterrupt  # what Ctrl-C raises in the driver

    cfg = _cfg(tiny_model_dir, tmp_path / "ok", steps=3, ray={"address": address, "namespace": "tandem-test"})
    with pytest.raises(KeyboardInterrupt):
        train_decoupled(cfg, hooks=RunHooks(on_step=interrupt))
    assert len(seen["actors"]) == 4  # worker, admission, weight registry, queue: all on the joined cluster
    assert not ray.is_initialized()  # the driver disconnected ...
    assert head_procs and all(_alive(pid, grace_s=0.0) for pid in head_procs)  # ... the cluster runs on
    assert _wait_until(lambda: not _tandem_actors(head_procs)), "actors of the stopped run are left"

    # a worker's user error (a reward function that raises) stops the run with one line, no restarts
    reward = tmp_path / "broken_reward.py"
    reward.write_text(textwrap.dedent(BROKEN_REWARD))
    bad = _cfg(tiny_model_dir, tmp_path / "bad", reward=f"{reward}:broken", ray={"address": address})
    with pytest.raises(WorkerFailedError, match=r"rollout worker 0: .*boom") as err:
        train_decoupled(bad)
    assert "\n" not in str(err.value)
    assert all(_alive(pid, grace_s=0.0) for pid in head_procs)
    assert _wait_until(lambda: not _tandem_actors(head_procs))


def _record_in_actor(path: Path):
    """An ``on_step`` hook that runs inside the learner actor: at step 1 it writes where the learner runs and
    with what into ``path`` (standard library and ray only: the hook is pickled by value)."""

    def record(run, step):
        if step != 1:
            return
        import json as _json
        import os as _os

        import ray as _ray

        seen = {
            "pid": _os.getpid(),
            "in_actor": _ray.get_runtime_context().get_actor_id() is not None,
            "resources": dict(_ray.get_runtime_context().get_assigned_resources()),
            "worker_pids": run.supervisor.pids(),
            "worker_resources": {str(k): v for k, v in run.supervisor.assigned_resources().items()},
            "bundles": _ray.util.placement_group_table(run.supervisor.placement_group)["bundles"],
        }
        path.write_text(_json.dumps(seen))

    return record


def test_learner_actor_local_run_has_the_learner_resources_and_leaves_nothing(
    tiny_model_dir, tmp_path, short_tmp, capsys
):
    torch.set_num_threads(1)
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        ray={"num_cpus": 2, "learner_actor": True},
        worker={"cpus": 1, "memory_mb": 200},
        learner={"cpus": 1, "memory_mb": 300},
    )
    seen_file = tmp_path / "seen.json"
    result = train_in_learner_actor(cfg, progress=True, hooks=RunHooks(on_step=_record_in_actor(seen_file)))
    assert result.steps == 3 and result.run_dir == tmp_path / "run"
    # the driver shows the actor's progress (plain lines: stdout is not a terminal here)
    out = capsys.readouterr().out
    assert "train 3/3 (100%)" in out and "reward " in out and "eta " in out, out
    check_accounting(result, 3)
    seen = json.loads(seen_file.read_text())
    # the learner ran in an actor (another process) holding exactly the learner's resources
    assert seen["in_actor"] and seen["pid"] != os.getpid()
    assert seen["resources"] == {"CPU": 1.0, "memory": 300 * 2**20}
    assert seen["worker_resources"] == {"0": {"CPU": 1.0, "memory": 200 * 2**20}}
    assert seen["bundles"] == {"0": {"CPU": 1.0, "memory": 200 * 2**20}}  # workers only: 1 + 1 = 2 CPUs
    # nothing left: learner and worker processes gone, no Ray connection; short_tmp checks the folder
    assert not any(_alive(pid) for pid in [seen["pid"], *seen["worker_pids"]])
    assert not ray.is_initialized()


def _record_ranks(path: Path):
    """An ``on_step`` hook run inside the learner actor: at step 1 it writes where the data-parallel ranks
    run (standard library and ray only: the hook is pickled by value)."""

    def record(run, step):
        if step != 1:
            return
        import json as _json
        import os as _os

        import ray as _ray

        ctx = _ray.get_runtime_context()
        seen = {
            "pid": _os.getpid(),
            "resources": dict(ctx.get_assigned_resources()),
            "rank_pids": run.dp.pids,
            "rank_resources": [r.resources for r in run.dp.procs],
            "world": run.learner.learn.dp.world_size,
            "bundles": _ray.util.placement_group_table(_ray.util.get_current_placement_group())["bundles"],
        }
        path.write_text(_json.dumps(seen))

    return record


def test_learner_actor_runs_a_data_parallel_learner_as_actors(tiny_model_dir, tmp_path, short_tmp):
    torch.set_num_threads(1)
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "run",
        ray={"num_cpus": 3, "learner_actor": True},
        worker={"cpus": 1},
        learner={"cpus": 1, "memory_mb": 300, "world_size": 2},
    )
    seen_file = tmp_path / "seen.json"
    result = train_in_learner_actor(cfg, hooks=RunHooks(on_step=_record_ranks(seen_file)))
    assert result.steps == 3
    check_accounting(result, 3)  # the ranks' replicas were compared after every step (else it raised)
    rows = step_rows(result.run_dir)
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    seen = json.loads(seen_file.read_text())
    assert seen["world"] == 2 and len(seen["rank_pids"]) == 1
    # rank 1 is another actor process with the same learner resources, in the learner's second bundle
    assert seen["rank_pids"][0] not in (seen["pid"], os.getpid())
    learner_res = {"CPU": 1.0, "memory": 300 * 2**20}
    assert seen["resources"] == learner_res and seen["rank_resources"] == [learner_res]
    assert seen["bundles"] == {"0": learner_res, "1": learner_res}
    assert not any(_alive(pid) for pid in [seen["pid"], *seen["rank_pids"]])
    assert not ray.is_initialized()


def test_learner_actor_ctrl_c_and_user_error_on_a_joined_cluster(tiny_model_dir, tmp_path, cluster, caplog):
    torch.set_num_threads(1)
    address, head_procs = cluster
    cfg = _cfg(tiny_model_dir, tmp_path / "ok", steps=50, ray={"address": address, "learner_actor": True})
    seen = {}

    def interrupt_after_step_1():  # Ctrl-C in the driver once the learner actor has trained a step
        rows = tmp_path / "ok" / "metrics.jsonl"
        if not _wait_until(lambda: rows.exists() and '"step": 1,' in rows.read_text(), limit_s=300):
            return  # the run failed or finished first: the test fails on pytest.raises
        seen["actors"] = {
            pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            for pid in _tandem_actors(head_procs)
        }
        _thread.interrupt_main()

    watcher = threading.Thread(target=interrupt_after_step_1, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        train(cfg)  # dispatches to the learner actor
    watcher.join(timeout=60)
    assert "the learner actor stopped its run" in caplog.text  # cancelled after its step, then cleaned up
    kinds = sorted(cmd.split()[0].split(".")[0] for cmd in seen["actors"].values())  # ray::Class.method
    assert kinds == sorted(
        ["ray::LearnerActor", "ray::RolloutActor", "ray::CoordinatorActor", "ray::WeightRegistry"]
        + ["ray::_QueueActor"]
    ), kinds
    assert not ray.is_initialized() and all(_alive(pid, grace_s=0.0) for pid in head_procs)
    assert _wait_until(lambda: not _tandem_actors(head_procs)), "actors of the stopped run are left"
    rows = step_rows(tmp_path / "ok")
    assert 1 <= len(rows) < 50  # stopped early

    reward = tmp_path / "broken_reward.py"
    reward.write_text(textwrap.dedent(BROKEN_REWARD))
    bad = _cfg(
        tiny_model_dir,
        tmp_path / "bad",
        reward=f"{reward}:broken",
        ray={"address": address, "learner_actor": True},
    )
    with pytest.raises(WorkerFailedError, match=r"rollout worker 0: .*boom") as err:
        train(bad)
    assert "\n" not in str(err.value) and type(err.value) is WorkerFailedError
    assert _wait_until(lambda: not _tandem_actors(head_procs))
