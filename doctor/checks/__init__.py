"""One module per area; importing this package registers every check with the registry."""

from . import (  # noqa: F401  (each module registers its area's checks)
    cache,
    comm,
    deepspeed_ops,
    gpu,
    job,
    mpi,
    python_env,
    system,
    toolkit,
    torch_build,
)
