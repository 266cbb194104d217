"""Placeholder for the services layer (see DESIGN.md, Architecture); filled by the service issues."""
