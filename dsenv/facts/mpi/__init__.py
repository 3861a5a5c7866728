"""MPI: which one is on PATH, how Open MPI was built, mpi4py's ABI, a real 2-rank probe."""
