"""Each sandbox limit, proved by code that tries to break it (and, where there are two layers, each
layer alone)."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tandem.agents.sandbox import SandboxLimits, network_namespace_available, run_python, run_python_async

FAST = SandboxLimits(cpu_s=1, wall_s=15, memory_mb=256)


def test_runs_code_in_a_temporary_folder_that_is_removed():
    r = run_python(
        "import os\nprint(os.getcwd())\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read())", FAST
    )
    assert r.ok and r.kill_reason is None, r.stderr
    folder, text = r.stdout.split()
    assert text == "hi" and "tandem-sandbox-" in folder
    assert not os.path.exists(folder)


def test_exit_status_and_stderr():
    r = run_python("import sys\nprint('out')\nsys.stderr.write('bad')\nsys.exit(3)", FAST)
    assert (r.stdout, r.stderr, r.exit_code, r.kill_reason, r.ok) == ("out\n", "bad", 3, None, False)
    r = run_python("1/0", FAST)
    assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr and r.kill_reason is None


RAISE_AND_LOOP = """
import resource
try:
    resource.setrlimit(resource.RLIMIT_CPU, (100, 100))
except PermissionError as err:
    print(err, flush=True)
while True:
    pass
"""


def test_infinite_loop_hits_the_cpu_limit_which_cannot_be_raised():
    r = run_python(RAISE_AND_LOOP, SandboxLimits(cpu_s=1, wall_s=30))
    assert r.kill_reason == "cpu_time" and r.exit_code < 0
    assert r.stdout == "sandbox: resource.setrlimit is not allowed\n"


def test_sleeping_code_hits_the_wall_clock_limit():
    start = time.perf_counter()
    r = run_python("import time\nprint('started', flush=True)\ntime.sleep(60)", SandboxLimits(wall_s=1.0))
    assert r.kill_reason == "wall_time" and r.stdout == "started\n"
    assert time.perf_counter() - start < 5


def test_memory_bomb_hits_the_memory_limit():
    r = run_python(
        "a = []\nwhile True:\n    a.append(bytearray(10**7))", SandboxLimits(memory_mb=128, wall_s=15)
    )
    assert r.kill_reason == "memory" and "MemoryError" in r.stderr


FORK_BOMB = """
import os
blocked = 0
for attempt in [
    lambda: os.fork(),
    lambda: os.system("echo child"),
    lambda: os.execv("/bin/echo", ["echo", "child"]),
    lambda: os.posix_spawn("/bin/echo", ["echo", "child"], {}),
    lambda: __import__("subprocess").run(["echo", "child"]),
    lambda: __import__("multiprocessing").Process(target=print, args=("child",)).start(),
    lambda: __import__("pty").fork(),
    lambda: __import__("ctypes").CDLL(None).fork(),
]:
    try:
        attempt()
    except (PermissionError, ImportError):
        blocked += 1
print("blocked", blocked)
while True:
    os.fork()
"""


def test_fork_bomb_is_blocked():
    r = run_python(FORK_BOMB, FAST)
    assert "child" not in r.stdout and r.stdout == "blocked 8\n", (r.stdout, r.stderr)
    assert r.exit_code == 1 and "sandbox: os.fork is not allowed" in r.stderr and r.kill_reason is None


def test_os_kill_of_the_parent_is_blocked():
    r = run_python(f"import os\nos.kill({os.getpid()}, 9)", FAST)
    assert "sandbox: os.kill is not allowed" in r.stderr


class _Listener:
    """A TCP server on localhost counting the connections it accepts."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def accepted_within(self, seconds: float) -> int:
        """``accepted`` once it is non-zero or ``seconds`` have passed: the child can print "connected"
        and exit before this thread, on a loaded machine, has run its ``accept``."""
        deadline = time.monotonic() + seconds
        while not self.accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.accepted

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


NET = """
import socket
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as err:
    print("refused", type(err).__name__, err)
"""


@pytest.mark.parametrize(
    ("namespace", "hooks"),
    [
        pytest.param(True, False, id="namespace-only"),
        pytest.param(False, True, id="hooks-only"),
        pytest.param(None, True, id="default"),
    ],
)
def test_network_attempt_fails(namespace, hooks):
    if namespace and not network_namespace_available():
        pytest.skip("unshare -n is not available here")
    server = _Listener()
    try:
        control = run_python(NET.format(port=server.port), SandboxLimits(network=True, wall_s=15))
        assert control.stdout.startswith("connected") and server.accepted_within(10) == 1  # the test can fail
        r = asyncio.run(
            run_python_async(NET.format(port=server.port), FAST, namespace=namespace, hooks=hooks)
        )
        assert r.stdout.startswith("refused"), (r.stdout, r.stderr)
        assert ("network access is not allowed" in r.stdout) == hooks
        time.sleep(0.3)
        assert server.accepted == 1
    finally:
        server.close()


WRITES = """
import os
target = {target!r}
attempts = {{
    "open": lambda: open(target, "w").write("x"),
    "os.open": lambda: os.close(os.open(target, os.O_WRONLY | os.O_CREAT)),
    "append": lambda: open(target, "a").write("x"),
    "rename": lambda: (open("inside", "w").close(), os.rename("inside", target)),
    "symlink": lambda: (os.symlink(target, "link"), open("link", "w").write("x")),
    "hardlink": lambda: os.link({existing!r}, "hard"),
    "dir_fd": lambda: os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=os.open(os.path.dirname(target), os.O_RDONLY)),
    "chdir": lambda: (os.chdir(os.path.dirname(target)), open(os.path.basename(target), "w")),
    "mkdir": lambda: os.mkdir(target),
    "remove": lambda: os.remove({existing!r}),
    "chmod": lambda: os.chmod({existing!r}, 0o777),
    "sys.path": lambda: (__import__("sys").path.insert(0, "."), __import__("mymod")),
}}
for name, attempt in attempts.items():
    try:
        attempt()
        print("WROTE", name)
    except PermissionError as err:
        print("blocked", name)
"""


def test_file_writes_outside_the_folder_are_blocked(tmp_path):
    target = tmp_path / "outside.txt"
    existing = tmp_path / "existing.txt"
    existing.write_text("keep")
    existing.chmod(0o644)
    r = run_python(
        WRITES.format(target=str(target), existing=str(existing)), FAST, files={"mymod.py": "X = 1"}
    )
    assert "WROTE" not in r.stdout and r.stdout.count("blocked") == 12, (r.stdout, r.stderr)
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["existing.txt"]
    assert existing.read_text() == "keep" and existing.stat().st_mode & 0o777 == 0o644


def test_huge_output_is_truncated_and_killed():
    limits = SandboxLimits(max_output_bytes=1000, wall_s=15)
    r = run_python("while True:\n    print('x' * 100)", limits)
    assert r.kill_reason == "output" and r.truncated and len(r.stdout) == 1000
    small = run_python("print('y' * 999, end='')", limits)
    assert small.ok and not small.truncated and len(small.stdout) == 999


def test_a_flood_is_killed_for_output_and_leaves_no_transport_open(monkeypatch):
    """The pipes of a run killed for output are read to their end. Left unread past the stream's buffer,
    the pipe never reached its end: the process wait timed out (reported as ``wall_time`` after the whole
    wall limit) and the subprocess transport outlived the event loop, failing later in the garbage
    collector (under load it broke pytest's own reporting)."""
    caught = []
    monkeypatch.setattr(sys, "unraisablehook", caught.append)
    flood = "import sys, time\nsys.stdout.write('x' * 10_000_000)\nsys.stdout.flush()\ntime.sleep(30)"
    r = run_python(flood, SandboxLimits(max_output_bytes=1000, wall_s=15))
    gc.collect()
    assert r.kill_reason == "output"
    assert not caught, [str(u.exc_value) for u in caught]


def test_runs_overlap():
    async def many():
        return await asyncio.gather(*[run_python_async("import time\ntime.sleep(1)", FAST) for _ in range(4)])

    start = time.perf_counter()
    results = asyncio.run(many())
    elapsed = time.perf_counter() - start
    assert all(r.ok for r in results)
    assert elapsed < 3.0, f"{elapsed:.2f}s (serial >= 4 s) load {os.getloadavg()}"


def test_limits_are_checked():
    with pytest.raises(ValueError, match="cpu_s must be > 0"):
        SandboxLimits(cpu_s=0)
    with pytest.raises(ValueError, match="plain file name"):
        run_python("", FAST, files={"../x.py": ""})


INSIDE_FILES = """
import os, shutil, tempfile
os.makedirs("a/b")
os.mkdir("c")
open("f", "w").close()
os.rename("f", "c/g")
os.symlink("c/g", "link")
os.chmod("c/g", 0o600)
os.utime("c/g")
os.remove("link")
os.rmdir("a/b")
with tempfile.TemporaryDirectory() as tmp:
    print("tmp inside", tmp.startswith(os.getcwd()))
print(sorted(os.listdir(".")))
"""


def test_file_management_inside_the_folder_works():
    """CPython reports an absent ``dir_fd`` as -1, not None: every mkdir/rename/remove/symlink/chmod was
    refused, even inside the folder (``tempfile.TemporaryDirectory`` found no usable folder)."""
    r = run_python(INSIDE_FILES, FAST)
    assert r.ok, r.stderr
    assert r.stdout == "tmp inside True\n['a', 'c', 'main.py']\n"


DIR_FD = """
import os, shutil
os.makedirs("a/b"); open("a/b/c", "w").write("1")
shutil.rmtree("a")  # unlinks and removes folders by dir_fd
print("rmtree", os.path.exists("a"))
os.mkdir("d")
fd = os.open("d", os.O_RDONLY)
os.mkdir("inner", dir_fd=fd)
print("inner", os.path.isdir("d/inner"))
top = os.open(".", os.O_RDONLY)
os.chdir("d/inner")  # "../{name}" is inside from here, outside from the folder `top` names
for attempt in [
    lambda: os.mkdir("../{name}", dir_fd=top),
    lambda: os.mkdir("../../{name}", dir_fd=fd),
    lambda: os.rename("../main.py", "../../{name}", src_dir_fd=fd, dst_dir_fd=fd),
    lambda: os.symlink("/etc", "../../{name}", dir_fd=fd),
]:
    try:
        attempt()
        print("ALLOWED")
    except PermissionError:
        print("refused")
"""


def test_dir_fd_calls_are_checked_against_their_folder(tmp_path):
    """``shutil.rmtree`` (which works by ``dir_fd``) cleans up inside the folder; a path relative to a
    ``dir_fd`` that leads outside is refused like any other."""
    name = f"tandem-dirfd-{os.getpid()}"
    r = run_python(DIR_FD.format(name=name), FAST)
    out = os.path.join(tempfile.gettempdir(), name)
    escaped = os.path.lexists(out)
    if escaped:
        (os.rmdir if os.path.isdir(out) and not os.path.islink(out) else os.remove)(out)
    assert r.ok, r.stderr
    assert r.stdout.split("\n")[:6] == ["rmtree False", "inner True", *["refused"] * 4]
    assert not escaped


BYPASSES = {
    "subinterpreter": "import _xxsubinterpreters as s\ns.run_string(s.create(), 'import os; os.system(\"touch {target}\")')",
    "patched builtin": "import builtins\nbuiltins.isinstance = lambda a, b: True\nopen({target!r}, 'w')",
    "patched posixpath": "import os, posixpath\nposixpath._joinrealpath = lambda *a: (os.getcwd(), True)\nopen({target!r}, 'w')",
    "hook state via gc": "import gc, os\n[o.clear() for o in gc.get_objects() if isinstance(o, set) and 'os.system' in o]\nos.system('touch {target}')",
    "hook state via traceback": (
        "import os\ntry:\n    os.fork()\nexcept PermissionError as e:\n    t = e.__traceback__\n"
        "    while t:\n        t.tb_frame.f_locals.get('blocked', set()).clear()\n        t = t.tb_next\n"
        "os.system('touch {target}')"
    ),
    "shared memory": "import _posixshmem, os\n_posixshmem.shm_open('/tandem-test-shm', os.O_CREAT | os.O_RDWR, 0o600)",
    "readline history": "import readline\nreadline.write_history_file({target!r})",
    "fifo": "import os\nos.mkfifo({target!r})",
    "test C API": "import _testcapi",
}


@pytest.mark.parametrize("code", BYPASSES.values(), ids=BYPASSES.keys())
def test_python_code_cannot_switch_the_hooks_off(tmp_path, code):
    target = tmp_path / "outside"
    r = run_python(code.format(target=str(target)), FAST)
    shm = "/dev/shm/tandem-test-shm"
    assert not target.exists() and not os.path.exists(shm) or os.remove(shm)
    assert r.exit_code == 1 and ("sandbox:" in r.stderr or "Error" in r.stderr), (r.stdout, r.stderr)


def test_other_processes_cannot_be_signalled_or_reniced_by_pid():
    """``os.kill`` is refused, but a pidfd (no audit event) reached any process of the user: the trainer."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (
            "import os, signal\nfor attempt in [\n"
            f"    lambda: signal.pidfd_send_signal(os.pidfd_open({victim.pid}), signal.SIGKILL),\n"
            f"    lambda: os.setpriority(os.PRIO_PROCESS, {victim.pid}, 19),\n"
            f"    lambda: os.sched_setaffinity({victim.pid}, {{0}}),\n"
            "]:\n    try:\n        attempt()\n        print('REACHED')\n    except AttributeError:\n        print('blocked')"
        )
        r = run_python(code, FAST)
        assert r.stdout == "blocked\n" * 3, (r.stdout, r.stderr)
        assert victim.poll() is None and os.getpriority(os.PRIO_PROCESS, victim.pid) == os.getpriority(
            os.PRIO_PROCESS, 0
        )
    finally:
        victim.kill()
        victim.wait()


def test_a_folder_nested_past_the_recursion_limit_is_removed():
    """``shutil.rmtree`` raised RecursionError into the caller and left the folder behind."""
    code = "import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint(os.getcwd())"
    r = run_python(code, SandboxLimits(cpu_s=5, wall_s=30))
    assert r.ok, r.stderr
    assert not os.path.exists(r.stdout.split("/d/")[0])


def test_the_trainers_environment_and_other_runs_folders_cannot_be_read(monkeypatch):
    """The trainer's environment (API keys) through /proc and the working folder of another run in flight
    (a group's runs answer the same prompt) are refused; the code's own /proc entry and folder are not."""
    monkeypatch.setenv("TANDEM_TEST_SECRET", "s3cret")
    other = tempfile.mkdtemp(prefix="tandem-sandbox-")  # another run's folder, as run_python makes one
    try:
        with open(os.path.join(other, "answer.py"), "w") as f:
            f.write("print(42)")
        code = f"""
import os
def attempt(what, fn):
    try:
        fn()
        print(what, "allowed")
    except PermissionError:
        print(what, "refused")
attempt("environ", lambda: open(f"/proc/{{os.getppid()}}/environ", "rb").read())
attempt("parent-root", lambda: open(f"/proc/{{os.getppid()}}/root/proc/{{os.getppid()}}/environ", "rb").read())
attempt("sibling-file", lambda: open({os.path.join(other, "answer.py")!r}).read())
attempt("sibling-list", lambda: os.listdir({other!r}))
attempt("sibling-scandir", lambda: list(os.scandir({other!r})))
attempt("own-proc", lambda: open("/proc/self/status").read())
attempt("own-folder", lambda: os.listdir("."))
"""
        r = run_python(code, FAST)
    finally:
        shutil.rmtree(other)
    assert r.exit_code == 0, r.stderr
    assert dict(line.split() for line in r.stdout.splitlines()) == {
        "environ": "refused",
        "parent-root": "refused",
        "sibling-file": "refused",
        "sibling-list": "refused",
        "sibling-scandir": "refused",
        "own-proc": "allowed",
        "own-folder": "allowed",
    }


def test_code_with_a_lone_surrogate_is_a_result_not_an_error_in_the_trainer():
    """A JSON tool call can carry ``"\\udc80"``: the code cannot be UTF-8, and the model reads why."""
    r = run_python("print('\udc80')", FAST)
    assert r.exit_code == 1 and "can't decode" in r.stderr and r.kill_reason is None, r.stderr


def test_code_that_raises_keyboardinterrupt_or_aborts_is_not_reported_as_a_limit():
    """Python exits an uncaught KeyboardInterrupt by SIGINT: an error of the code, not a kill; ``os.abort``
    is a signal, named as one to the model rather than as a "killed limit"."""
    from tandem.agents.python_env import sandbox_output

    r = run_python("raise KeyboardInterrupt", FAST)
    assert r.kill_reason is None and not r.ok and "KeyboardInterrupt" in sandbox_output(r).content
    r = run_python("import os\nos.abort()", FAST)
    assert r.kill_reason == "killed" and sandbox_output(r).content == "killed by signal SIGABRT"


def test_many_files_under_the_size_limit_hit_the_disk_limit():
    """RLIMIT_FSIZE caps each file; the folder's total is polled: files of 4 MiB until the disk is full
    are killed past ``max_disk_bytes``, and the folder is removed."""
    code = "import os\nfor i in range(1000):\n    open(f'f{i}', 'wb').write(os.urandom(4 << 20))\nprint('wrote all')"
    limits = SandboxLimits(cpu_s=20, wall_s=20, memory_mb=256, max_disk_bytes=16 << 20)
    r = run_python(code, limits)
    assert r.kill_reason == "disk" and "wrote all" not in r.stdout, (r.stdout, r.stderr)
    assert run_python("open('f', 'wb').write(b'x' * (8 << 20))", limits).ok  # under the limit
