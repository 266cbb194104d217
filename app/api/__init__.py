"""Placeholder for the api layer (see DESIGN.md, Architecture); filled by the service issues."""
