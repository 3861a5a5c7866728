"""Checks about the software stack: Python env, torch, toolkits, DeepSpeed ops, caches."""
