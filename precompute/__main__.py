"""`python -m precompute`: the same CLI, for subprocesses that must use this interpreter."""

from precompute.cli.main import app

app()
