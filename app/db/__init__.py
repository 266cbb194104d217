"""Placeholder for the db layer (see DESIGN.md, Architecture); filled by the service issues."""
