"""Placeholder for the services layer (see DESIGN.md, Architecture)."""
