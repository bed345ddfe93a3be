"""Fixtures of the browser tests (defined in harness.py, which the tests import their helpers from, so
both see one copy of the module and one admin key)."""

from tests.browser.harness import browser, console_errors, new_page, replicas, screenshots

__all__ = ["browser", "console_errors", "new_page", "replicas", "screenshots"]
