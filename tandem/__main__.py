"""``python -m tandem`` — the same CLI as the ``tandem`` console script."""

from tandem.cli.main import app

if __name__ == "__main__":  # pragma: no cover
    app()
