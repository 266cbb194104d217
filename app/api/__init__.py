"""Placeholder for the api layer (see DESIGN.md, Architecture)."""
