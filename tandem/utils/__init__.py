"""Small, dependency-light helpers shared across layers: atomic file writes, JSON-safe values, seeding.

Import the submodules directly (``tandem.utils.io``, ``tandem.utils.seed``); this package imports
nothing at import time so that ``tandem.utils.io`` stays usable without torch being loaded.
"""
