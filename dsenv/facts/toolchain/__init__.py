"""The build toolchain: nvcc/hipcc, compilers, -march=native, fatbinaries, JIT extensions."""
