"""Prefect flows: the nightly schedule that runs each output's job and publishes it."""
