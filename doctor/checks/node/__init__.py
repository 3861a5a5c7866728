"""Checks about the node itself: OS, CPU, memory, /dev/shm, GPUs and the job's layout on them."""
