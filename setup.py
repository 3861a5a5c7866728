"""Install the user's top-level folders as subpackages of ``dsenv``.

The repository keeps ``envs/``, ``doctor/``, ``provision/`` and ``workloads/`` at the top
level (the user's layout); they install as ``dsenv.envs``, ``dsenv.doctor``, ... through
``package_dir``, so editable and normal installs import the same names.
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
MAPPED_FOLDERS = ("envs", "doctor", "provision", "workloads")


def _subpackages(folder: str, package: str) -> dict:
    """Every folder with an __init__.py below ``folder``, as {dotted package: folder}."""
    found = {}
    for init in sorted((HERE / folder).rglob("__init__.py")):
        rel = init.parent.relative_to(HERE / folder)
        dotted = ".".join((package, *rel.parts)) if rel.parts else package
        found[dotted] = init.parent.relative_to(HERE).as_posix()
    return found


package_dir = _subpackages("dsenv", "dsenv")
for name in MAPPED_FOLDERS:
    package_dir.update(_subpackages(name, f"dsenv.{name}"))

setup(
    packages=sorted(package_dir),
    package_dir=package_dir,
    package_data={pkg: ["*.toml", "*.json", "*.yml", "*.txt", "*.lock", "*.in"]
                  for pkg in package_dir},
    include_package_data=True,
)
