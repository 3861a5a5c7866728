"""The Python environment under test: interpreter, packages, torch, DeepSpeed, ds_config."""
