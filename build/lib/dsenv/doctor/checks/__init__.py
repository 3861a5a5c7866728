"""One module per area; importing this package registers every check."""

import importlib

AREA_MODULES = ("system", "python_env", "gpu", "torch_build", "toolkit", "deepspeed_ops",
                "comm", "mpi", "cache", "job")

for _name in AREA_MODULES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:  # an area not written yet
        if _exc.name != f"{__name__}.{_name}":
            raise
