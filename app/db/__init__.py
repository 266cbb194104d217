"""Placeholder for the db layer (see DESIGN.md, Architecture)."""
