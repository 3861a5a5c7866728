"""One module per area; importing this package registers every check with the registry."""

from . import (  # noqa: F401  (each module registers its area's checks)
    builds,
    cache,
    comm,
    comm_env,
    cpu_flags,
    deepspeed_ops,
    gpu,
    job,
    launch,
    launch_hosts,
    mpi,
    node,
    op_archs,
    python_env,
    system,
    toolkit,
    torch_build,
)
