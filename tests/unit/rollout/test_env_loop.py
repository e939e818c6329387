"""The environments' event loop: closing it after a failed call leaves nothing for asyncio to complain
about (the CLI's one error line stays the only line)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A call's jobs fail, the caller raises the first error, cancels the rest and closes the loop: the jobs
# that waited behind one_at_a_time's lock never ran (their coroutines were never awaited) and the ones
# that failed after the first were never asked for their error. Both used to be reported when collected
# ("coroutine ... was never awaited", "Task exception was never retrieved") after `tandem eval`'s error.
SCRIPT = """
import asyncio, gc, logging, sys
from concurrent.futures import FIRST_EXCEPTION
from tandem.rollout.env_loop import EnvLoop, call, one_at_a_time

logging.basicConfig(level=logging.WARNING)

class Env:
    def reset(self, row):
        raise KeyError("no secret")

class Inline(Env):
    inline = True  # reset called on the loop, not in a worker thread

async def reset(env):
    return await asyncio.wait_for(call(env.reset, {}), 30.0)

for threaded in (False, True):  # lockstep episodes; async ones (the loop in a thread of its own)
    for lock in (asyncio.Lock(), None):  # env.concurrent false / true
        for cls in (Env, Inline):
            loop = EnvLoop(4, threaded)
            futures = [loop.submit(one_at_a_time(reset(cls()), lock)) for _ in range(8)]
            try:
                loop.wait(futures, None, FIRST_EXCEPTION)
                [f.result() for f in futures]
            except KeyError:
                pass
            finally:
                for f in futures:
                    f.cancel()
                loop.close()
            del futures, loop
            gc.collect()
print("done", flush=True)
"""


def test_closing_after_a_failed_call_is_quiet():
    script = textwrap.dedent(SCRIPT)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
    assert "never awaited" not in out.stderr and "never retrieved" not in out.stderr, out.stderr
    assert out.stderr.strip() == ""
