"""One module per area; importing this package registers every check with the registry."""

from . import (  # noqa: F401  (each module registers its area's checks)
    builds,
    cache,
    comm,
    comm_env,
    deepspeed_ops,
    gpu,
    job,
    launch,
    mpi,
    node,
    python_env,
    system,
    toolkit,
    torch_build,
)
