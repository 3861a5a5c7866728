"""DeepSpeed's ops: which to build, why others are left out, the build, its cache, the CUDA toolkit."""
