"""Registers the suite's plugin for runs in this repository (one place only: see README)."""

pytest_plugins = ["conformance.plugin"]
