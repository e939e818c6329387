"""The ``tandem`` command line."""
