"""The server process's heap and Python's cyclic garbage collector.

A loaded server holds about 400,000 objects the collector tracks (torch, transformers, the model's
modules), all alive until the process ends. Every full collection walks all of them: measured under
``bench/serve.py``'s load, one took 0.25-0.75 s of the event loop's thread, about 0.2 ms per request
averaged over a 10 s run. :func:`freeze` moves what is alive once the server is built into the
collector's permanent generation (``gc.freeze``), so later collections walk only what requests
allocate (about 19,000 objects). vLLM's OpenAI server does the same after start-up. Served arms are
never unloaded, so nothing frozen becomes garbage the collector would have had to find.

When the server stops, :func:`unfreeze` hands the heap back to the collector, so the interpreter's
teardown frees it as usual: frozen objects are never freed, and extension modules that count their
objects at exit (triton's nanobind bindings, imported by torch) would print hundreds of "leaked" lines
after a Ctrl-C.

Only a serving process freezes (:func:`tandem.serve.server.run_server` and each replica worker); an
app built in a test process leaves that process's collector alone.
"""

from __future__ import annotations

import gc

_frozen = False  # this process froze its start-up heap


def freeze() -> None:
    """Collect garbage, then freeze every object alive now (``gc.freeze``)."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True


def refreeze() -> None:
    """After loading more (an arm loaded through the admin API): freeze again, if this process froze
    at start-up. The collection walks only what is not frozen yet."""
    if _frozen:
        freeze()


def unfreeze() -> None:
    """The server stopped: frozen objects back to the collector (``gc.unfreeze``), if this process froze."""
    global _frozen
    if _frozen:
        gc.unfreeze()
        _frozen = False
