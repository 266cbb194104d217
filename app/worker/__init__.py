"""Placeholder for the worker layer (see DESIGN.md, Architecture)."""
