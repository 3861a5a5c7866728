"""Probes gather facts (run a command, read a file) and parse them with pure functions.

Parsers take text and return data, so tests feed them recorded real outputs from
tests/fixtures/ for hardware this machine does not have.
"""
