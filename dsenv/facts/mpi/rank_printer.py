"""The program `dsenv doctor --probe` starts as 2 MPI ranks: each prints one marked JSON line.

Passed to the job's Python with ``-c`` (read as text, never imported by dsenv), so it runs
wherever mpi4py does: in a container or a venv that does not have dsenv installed.
"""

import json
import os
import socket

from mpi4py import MPI

world = MPI.COMM_WORLD
print("DSENV-MPI-RANK " + json.dumps({
    "rank": world.Get_rank(), "size": world.Get_size(), "host": socket.gethostname(),
    "pid": os.getpid(), "library": MPI.Get_library_version().strip("\x00 \n").splitlines()[0],
}), flush=True)
world.Barrier()
