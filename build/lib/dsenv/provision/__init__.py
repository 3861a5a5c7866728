"""``dsenv provision``: locked environments with DeepSpeed ops precompiled (issue #4)."""
