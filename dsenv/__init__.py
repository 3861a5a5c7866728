"""dsenv: reproducible DeepSpeed environments, health checks and smoke workloads for HPC."""

from pathlib import Path as _Path

__version__ = "0.1.0"

# In the source checkout, dsenv.envs, dsenv.doctor, dsenv.provision and dsenv.workloads are the
# top-level folders beside this one (setup.py's package_dir). A `python -m dsenv ...` started
# with the checkout as its working directory (torchrun's and mpirun's ranks, a job script run
# from the clone) imports this folder ahead of the installed package, and without the
# checkout's root on the package path every subpackage import failed (ModuleNotFoundError:
# dsenv.doctor; seen on a GPU node, `dsenv doctor --distributed --launch torchrun` run from
# the clone). An installed package holds its subpackages inside it and is left as it is.
_ROOT = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).resolve().parent / "doctor").is_dir() and \
        (_ROOT / "setup.py").is_file() and (_ROOT / "doctor" / "__init__.py").is_file():
    __path__.append(str(_ROOT))  # noqa: F821 (a package's __path__)
