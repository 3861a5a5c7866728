"""Requirement inputs of `dsenv lock` (<stack>.in), shipped as package data."""
