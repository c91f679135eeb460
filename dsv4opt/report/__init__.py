"""Renderers: rich tables, JSON, Markdown/HTML, plots. They take profiles and comparisons, never traces."""
