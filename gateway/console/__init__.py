"""The operator console at `/console`: server-rendered pages over the admin API (docs/console.md)."""

from gateway.console.routes import console_controller

__all__ = ["console_controller"]
