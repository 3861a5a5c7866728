"""One module per area, grouped by concern (node/, software/, job/); importing this package
registers every check with the registry."""

from dsenv.doctor.checks.job import (  # noqa: F401  (each module registers its area's checks)
    comm,
    comm_env,
    config,
    launch,
    launch_hosts,
    mpi,
)
from dsenv.doctor.checks.node import cpu_flags, gpu, layout, system  # noqa: F401
from dsenv.doctor.checks.software import (  # noqa: F401
    builds,
    cache,
    deepspeed_ops,
    interpreter_build,
    op_archs,
    python_env,
    toolkit,
    torch_build,
    torch_extensions,
)
