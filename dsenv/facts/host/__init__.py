"""The host: CPU, memory, mounts, processes, cache folders, and its fingerprint."""
