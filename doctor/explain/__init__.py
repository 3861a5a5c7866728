"""`dsenv explain`: read an error message or a whole job log, find the root error and name
its cause (command.py: the command; logread.py: the log reader; rank.py: the evidence;
loader.py: the dynamic loader and linker family)."""

from dsenv.doctor.explain.command import add_explain_parser, run_explain

__all__ = ["add_explain_parser", "run_explain"]
