"""Placeholder for the worker layer (see DESIGN.md, Architecture); filled by the service issues."""
