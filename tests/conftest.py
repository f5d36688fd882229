"""Shared pytest configuration: the real control plane fixtures from testenv."""

pytest_plugins = ["testenv.pytest_plugin"]
