"""Verifying a built environment: every locked package imports, shared libraries resolve."""
