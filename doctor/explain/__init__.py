"""`dsenv explain`: read an error message or a whole job log, find the root error and name
its cause (command.py: the command; arguments.py: its arguments; logread.py: the log reader;
rank.py: the evidence; loader.py: the dynamic loader and linker family).

Nothing is imported here: cli.py takes only arguments.py on every run, and the doctor's
distributed launcher only logread.py; the rules load when the command runs."""
