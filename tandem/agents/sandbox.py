"""Run untrusted Python (a model's code) in a limited subprocess.

Each run gets a fresh interpreter (``python -I -S``: no site-packages, no user site, no environment
variables honoured, standard library only) in a new temporary working folder that is removed afterwards,
with a scrubbed environment and stdin from ``/dev/null``. What each limit guarantees, by layer:

Kernel (holds against any code, native included; the child sets its rlimits on itself before the code
runs, and a process running as root could raise them again, which the interpreter layer refuses):
- CPU time: ``RLIMIT_CPU`` (SIGXCPU at the limit, SIGKILL a second later) -> ``kill_reason="cpu_time"``.
- Memory: ``RLIMIT_AS`` caps the address space; allocation fails (``MemoryError``) ->
  ``kill_reason="memory"``.
- File size: ``RLIMIT_FSIZE`` caps every file written; open files: ``RLIMIT_NOFILE``; no core dumps.
- Disk: the parent polls the folder's total (allocated blocks) and kills the group past
  ``max_disk_bytes`` -> ``"disk"`` (RLIMIT_FSIZE caps each file, not their number).
- Wall clock: the parent kills the whole process group (the child starts a new session) ->
  ``"wall_time"``. Output: each stream is read up to ``max_output_bytes``; beyond that the group is
  killed -> ``"output"`` and the kept text is marked truncated.
- Network: when ``unshare -n`` works (root, or unprivileged user namespaces), the child runs in a new,
  empty network namespace: no interface but a down loopback, so nothing is reachable, not even
  localhost. :func:`network_namespace_available` says whether this machine has it.

Interpreter (Python audit hooks installed before the code runs; they hold against Python code, not
against native code, which they therefore refuse to load: ``ctypes`` and the ``_posixsubprocess``
module are blocked and imports stop working once ``sys.path`` is changed, so no extension module can be
loaded from the working folder):
- No processes: ``os.fork``, ``os.exec*``, ``os.system``, ``os.posix_spawn``, ``subprocess``,
  ``multiprocessing``, ``pty`` raise ``PermissionError``. (``RLIMIT_NPROC`` is not a usable limit here:
  it counts every process of the user and root ignores it.)
- No raising of the rlimits (``resource.setrlimit``/``prlimit``) and no signals to other processes.
- No sockets of any family (the namespace's second line, and the only one where it is unavailable).
- No writes outside the working folder: opening a file for writing, creating, renaming, linking,
  removing or changing the mode of a path outside it raises ``PermissionError``, as does opening a
  directory outside it (which would allow ``dir_fd`` writes); a path given with a ``dir_fd`` is checked
  from that folder (``shutil.rmtree`` works by them). Reading is
  allowed (the standard library is read from disk), except other processes' ``/proc`` entries (the
  trainer's environment) and the working folders of other runs in flight.

This is a guard against model mistakes and reward hacking, not a boundary against a determined
attacker (no seccomp filter, same user id); run untrusted services in a container or a VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_MIB = 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run. ``network=True`` lifts both network layers (trusted code only)."""

    cpu_s: float = 5.0  # CPU seconds (RLIMIT_CPU, rounded up to whole seconds)
    wall_s: float = 10.0  # wall-clock seconds, interpreter start-up included
    memory_mb: int = 512  # address-space limit (RLIMIT_AS)
    max_output_bytes: int = 16 * 1024  # per stream; more kills the run
    max_file_bytes: int = 16 * _MIB  # largest file the code may write (RLIMIT_FSIZE)
    max_disk_bytes: int = 64 * _MIB  # all files of the working folder together (polled); more kills the run
    max_open_files: int = 64  # RLIMIT_NOFILE
    network: bool = False

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "max_output_bytes", "max_file_bytes", "max_disk_bytes",
                     "max_open_files"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    """What a run produced. ``exit_code`` is the process's status (negative: killed by that signal);
    ``kill_reason`` is ``cpu_time``, ``wall_time``, ``memory``, ``output``, ``disk`` or ``killed`` (another
    signal), None when the code ended by itself."""

    stdout: str
    stderr: str
    exit_code: int | None
    kill_reason: str | None
    seconds: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.kill_reason is None


# Run inside the child as `python -I -S -c _BOOT <workdir> <allow_network> <hooks> <limits>`: sets its
# rlimits, installs the audit hook, then runs main.py from the working folder as __main__.
_BOOT = r"""
import os, sys
def _install(root, allow_net, isinstance=isinstance, len=len, any=any, Exception=Exception,
             PermissionError=PermissionError, str=str, bytes=bytes, int=int, tuple=tuple, sys=sys):
    # Builtins above, and the path functions below (a private copy of posixpath on captured os functions),
    # are bound here so that code patching builtins, os or posixpath cannot fool the checks; the state the
    # hook keeps is immutable (a traceback reaches its frame).
    import builtins, posixpath, stat, types, posix, _signal
    # No audit event covers these, which reach other processes by pid (signal the trainer through a
    # pidfd, renice it, pin its CPUs): they are removed.
    # mkfifo/mknod raise no audit event on every version either: a node could be made anywhere.
    for name in ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                 "mkfifo", "mknod"):
        os.__dict__.pop(name, None), posix.__dict__.pop(name, None)
    _signal.__dict__.pop("pidfd_send_signal", None)
    names = ("fspath", "fsdecode", "fsencode", "lstat", "stat", "readlink", "getcwd", "getcwdb", "sep")
    g = dict(posixpath.__dict__, __builtins__=dict(builtins.__dict__),
             os=types.SimpleNamespace(**{n: getattr(os, n) for n in names}),
             stat=types.SimpleNamespace(S_ISLNK=stat.S_ISLNK, S_ISDIR=stat.S_ISDIR))
    for n, f in list(g.items()):
        if isinstance(f, types.FunctionType):
            g[n] = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
            g[n].__kwdefaults__ = f.__kwdefaults__
    realpath, isdir, fspath, fsdecode = g["realpath"], g["isdir"], os.fspath, os.fsdecode
    root = realpath(root)
    prefix = root + os.sep
    # not readable either: other processes' /proc entries (the trainer's environment holds API keys) and
    # the working folders of other runs in flight (a group's runs answer the same prompt)
    sep = os.sep
    siblings = realpath(os.path.dirname(root)) + sep + "tandem-sandbox-"
    own = "/proc/" + str(os.getpid())
    path0 = tuple(sys.path)
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked = frozenset({"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
               "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.kill",
               "os.killpg", "signal.pthread_kill", "os.setuid", "sys.remote_exec",
               "resource.setrlimit", "resource.prlimit", "cpython.PyInterpreterState_New",
               "gc.get_objects", "gc.get_referrers", "gc.get_referents"})
    # Extension modules that reach around the hooks: processes, native code, sub-interpreters (which do
    # not run this hook), files written natively (shared memory, readline history).
    native = frozenset({"_posixsubprocess", "_ctypes", "_xxsubinterpreters", "_posixshmem", "readline",
                        "_testcapi", "_testinternalcapi"})
    # event -> (positions of path arguments that must lie inside the folder, positions of dir_fd arguments,
    # which CPython reports as -1 when not given)
    paths = types.MappingProxyType({
             "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
             "os.rename": ((0, 1), (2, 3)), "os.symlink": ((1,), (2,)), "os.link": ((0, 1), (2, 3)),
             "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.truncate": ((0,), ()),
             "os.utime": ((0,), (3,)), "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()),
             "os.mkfifo": ((0,), (2,)), "os.mknod": ((0,), (3,)), "shutil.rmtree": ((0,), (1,)),
             "sqlite3.connect": ((0,), ())})
    readlink = os.readlink
    def resolved(p, base=None):
        # the real path of p (relative to the folder `base` when given: a dir_fd's), None when it has none
        try:
            p = fspath(p)
            if isinstance(p, bytes):
                p = fsdecode(p)
            return realpath(p if base is None or p.startswith(sep) else base + sep + p)
        except Exception:
            return None
    def inside(p, base=None):
        if isinstance(p, int):
            return True
        p = resolved(p, base)
        return p is not None and (p == root or p.startswith(prefix))
    def fd_folder(fd):
        # the folder a dir_fd argument names, or None when it is not a folder inside the working folder
        try:
            folder = readlink("/proc/self/fd/" + str(fd))
        except Exception:
            return None
        return folder if inside(folder) else None
    def private(p):
        p = resolved(p)
        if p is None:
            return False
        if p.startswith(siblings):
            return not (p == root or p.startswith(prefix))
        parts = p.split(sep)
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and sep.join(parts[:3]) != own
    def deny(what):
        raise PermissionError(f"sandbox: {what} is not allowed")
    def hook(event, args):
        if event in blocked:
            deny(event)
        elif event == "open":
            path, _mode, flags = args
            if isinstance(path, (str, bytes)) and private(path):
                deny(f"reading {path!r}")
            if not inside(path):
                if (flags or 0) & wflags:
                    deny(f"writing {path!r} outside the working folder")
                if isinstance(path, (str, bytes)) and isdir(path):
                    deny(f"opening the folder {path!r} outside the working folder")
        elif event in paths:
            where, fds = paths[event]
            bases = []  # the folder of the dir_fd that goes with each path argument (shutil.rmtree uses them)
            for i in fds:
                fd = args[i] if i < len(args) else None
                base = None if fd is None or fd == -1 else fd_folder(fd)
                if fd is not None and fd != -1 and base is None:
                    deny(f"{event} with a dir_fd outside the working folder")
                bases.append(base)
            for k, i in enumerate(where):
                base = bases[k] if k < len(bases) else None
                if i < len(args) and (not inside(args[i], base) or isinstance(args[i], int) and event != "os.truncate"):
                    deny(f"{event} outside the working folder ({args[i]!r})")
        elif event in ("os.listdir", "os.scandir") and args[0] is not None and private(args[0]):
            deny(f"listing {args[0]!r}")
        elif event == "socket.__new__" and not allow_net:
            deny("network access")
        elif event == "import":
            if args[0] in native or tuple(sys.path) != path0:
                deny(f"importing {args[0]}")
    sys.addaudithook(hook)
import resource
_root, _net, _hooks = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
_cpu, _mem, _fsize, _nofile = (int(x) for x in sys.argv[4].split(","))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (_nofile, _nofile))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
del sys.argv[1:], resource, _cpu, _mem, _fsize, _nofile
sys.argv[0] = "main.py"
with open(os.path.join(_root, "main.py"), encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
if _hooks:
    _install(_root, _net)
del _install, _root, _net, _hooks, _f
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """True when ``unshare -n`` can start a process in a new network namespace here (probed once)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "-n", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _limit_args(limits: SandboxLimits) -> str:
    """The rlimits the child sets on itself first thing (CPU seconds rounded up, bytes), comma-joined.
    Set in the child rather than in a ``preexec_fn``, which is unsafe in a process with threads."""
    cpu = max(1, int(-(-limits.cpu_s // 1)))
    return f"{cpu},{limits.memory_mb * _MIB},{limits.max_file_bytes},{limits.max_open_files}"


def _command(
    workdir: str, limits: SandboxLimits, python: str, namespace: bool | None, hooks: bool
) -> list[str]:
    flags = ["1" if limits.network else "0", "1" if hooks else "0", _limit_args(limits)]
    cmd = [python, "-I", "-S", "-c", _BOOT, workdir, *flags]
    if namespace is None:
        namespace = not limits.network and network_namespace_available()
    if namespace:
        cmd = [shutil.which("unshare") or "unshare", "-n", *cmd]
    return cmd


async def _read_capped(stream: asyncio.StreamReader, cap: int, over: asyncio.Event) -> tuple[bytes, bool]:
    """Up to ``cap`` bytes of ``stream``; sets ``over`` when it offers more, then reads on to the end of
    the stream (the caller kills the group, so the end comes at once) and drops the rest: a pipe left
    unread keeps its transport open past the event loop, whose late ``__del__`` then fails in the
    garbage collector (under load it broke the test run's own source parsing)."""
    buf = bytearray()
    while chunk := await stream.read(65536):
        if len(buf) <= cap:
            buf += chunk
            if len(buf) > cap:
                over.set()
    return bytes(buf[:cap]), len(buf) > cap


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_python_async(
    code: str,
    limits: SandboxLimits | None = None,
    *,
    python: str | None = None,
    files: dict[str, str] | None = None,
    namespace: bool | None = None,
    hooks: bool = True,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox (see the module docstring); never raises for
    anything the code does. ``files`` are written into the working folder first (name -> text).
    Many runs may be awaited concurrently. ``namespace`` (None: when available and the network is off)
    and ``hooks`` switch one layer off, so tests can prove each layer alone."""
    limits = limits or SandboxLimits()
    workdir = tempfile.mkdtemp(prefix="tandem-sandbox-")
    start = time.perf_counter()
    try:
        for name, text in {**(files or {}), "main.py": code}.items():
            target = Path(workdir, name)
            if target.resolve().parent != Path(workdir).resolve():
                raise ValueError(f"sandbox file name {name!r} must be a plain file name")
            # a lone surrogate (JSON tool calls carry "\udc80") is written as it is: the child's SyntaxError
            # tells the model, where encoding it here would raise in the trainer
            target.write_bytes(text.encode("utf-8", "surrogatepass"))
        return await _run(workdir, limits, python or sys.executable, start, namespace, hooks)
    finally:
        _remove_folder(workdir)


def _remove_folder(folder: str) -> None:
    """Remove the working folder, whatever the code left in it: ``shutil.rmtree`` raises RecursionError on
    folders nested deeper than the recursion limit (a loop of ``mkdir``/``chdir`` makes one in a second),
    and leaves folders whose permissions the code took away; ``rm -rf`` then takes what is left."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(folder, ignore_errors=True)
    if os.path.lexists(folder):
        subprocess.run(["chmod", "-R", "u+rwx", "--", folder], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", "--", folder], capture_output=True, check=False)


async def _run(
    workdir: str, limits: SandboxLimits, python: str, start: float, namespace: bool | None, hooks: bool
) -> SandboxResult:
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *_command(workdir, limits, python, namespace, hooks),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=workdir,
        env=env,
        start_new_session=True,
    )
    over = asyncio.Event()
    assert proc.stdout is not None and proc.stderr is not None
    readers = asyncio.ensure_future(
        asyncio.gather(
            _read_capped(proc.stdout, limits.max_output_bytes, over),
            _read_capped(proc.stderr, limits.max_output_bytes, over),
        )
    )
    over_wait = asyncio.ensure_future(over.wait())
    disk = asyncio.ensure_future(_watch_disk(workdir, limits.max_disk_bytes))
    try:
        done, _ = await asyncio.wait(
            {readers, over_wait, disk}, timeout=limits.wall_s, return_when="FIRST_COMPLETED"
        )
        if over.is_set() or disk in done:
            reason = "output" if over.is_set() else "disk"
        else:
            reason = None if readers in done else "wall_time"
        if reason is not None:
            _kill_group(proc)
        (out, out_cut), (err, err_cut) = await readers
        left = max(0.0, limits.wall_s - (time.perf_counter() - start))
        try:  # the streams can close before the process ends (the code closed them)
            exit_code = await asyncio.wait_for(proc.wait(), left)
        except TimeoutError:
            reason = "wall_time"
            _kill_group(proc)
            exit_code = await proc.wait()
    finally:
        over_wait.cancel()
        disk.cancel()
        _kill_group(proc)  # children that outlived the code (none, unless a hook was bypassed)
    stderr = err.decode("utf-8", "replace")
    if reason is None:
        reason = _exit_reason(exit_code, stderr)
    return SandboxResult(
        out.decode("utf-8", "replace"),
        stderr,
        exit_code,
        reason,
        time.perf_counter() - start,
        out_cut or err_cut,
    )


async def _watch_disk(folder: str, limit: int, interval: float = 0.05) -> None:
    """Return once the files under ``folder`` take more than ``limit`` bytes of disk (polled: RLIMIT_FSIZE
    caps each file, nothing caps their number)."""
    while _disk_bytes(folder, limit) <= limit:
        await asyncio.sleep(interval)


def _disk_bytes(folder: str, limit: int) -> int:
    """Bytes of disk the files under ``folder`` take (allocated blocks: a sparse file counts what it
    uses), counted until past ``limit``."""
    total, stack = 0, [folder]
    while stack and total <= limit:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
        except OSError:  # removed meanwhile, or a folder the code made unreadable
            continue
    return total


def _exit_reason(exit_code: int, stderr: str) -> str | None:
    if exit_code == -signal.SIGXCPU:
        return "cpu_time"
    if exit_code == -signal.SIGINT and stderr.rstrip().endswith("KeyboardInterrupt"):
        return None  # the code raised KeyboardInterrupt itself: an error like any other, not a kill
    if exit_code < 0:
        return "cpu_time" if exit_code == -signal.SIGKILL else "killed"
    if exit_code != 0 and "MemoryError" in stderr[-2000:]:
        return "memory"
    return None


def run_python(code: str, limits: SandboxLimits | None = None, **kwargs: object) -> SandboxResult:
    """Blocking :func:`run_python_async` (from synchronous code; inside an event loop await the async
    one)."""
    return asyncio.run(run_python_async(code, limits, **kwargs))  # type: ignore[arg-type]
