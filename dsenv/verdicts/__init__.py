"""Verdicts more than one command needs, as plain functions over facts (doctor and provision)."""
