"""Commands: filled in by the issue that owns them."""

from dsv4opt.cli import app  # noqa: F401
