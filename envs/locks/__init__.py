"""Hashed locks written by `dsenv lock` (<stack>.txt), shipped as package data."""
