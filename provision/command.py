"""Running ``dsenv provision``, ``dsenv provision openmpi`` and ``dsenv lock`` (their parsers
are parsers.py's).

``dsenv provision``: arguments -> Plan (plan.py) -> environment (build.py), ``--dry-run``
prints the plan and writes nothing; ``openmpi``: arguments -> OpenMpiBuild -> eb, judged and
recorded (openmpi.py); ``dsenv lock``: a stack's hashed lock (locks.py, conda_locking.py).
"""

from __future__ import annotations

from pathlib import Path

from dsenv import targetlock
from dsenv.envs.stacks import get_stack
from dsenv.provision import ProvisionError
from dsenv.provision.conda.locking import lock_conda
from dsenv.provision.conda.recipe import lock_path as conda_lock_path
from dsenv.provision.conda.recipe import recipe_path
from dsenv.provision.locks import LINUX_X86_64, compile_lock, lock_path, requirements_path
from dsenv.provision.openmpi.provide import make_build, provision_openmpi
from dsenv.provision.uvcmd import stack_sources

# `dsenv provision` options that `dsenv provision openmpi` refuses (they shape Python
# environments)
ENV_OPTIONS = ("arch", "kind", "site", "stack", "prefix", "lock", "python", "find_links",
               "index_url")
ENV_FLAGS = ("no_index", "no_bytecode", "force")


def run_provision(args, argv: list[str]) -> int:
    if getattr(args, "provision_what", None) == "openmpi":
        return run_openmpi(args, argv)
    # rich: build.py shows its progress with rich.console (kept off dsenv --help)
    from dsenv.provision.build import provision_command

    return provision_command(args, argv)


def run_lock(args) -> int:
    stack = get_stack(args.stack)
    out = Path(args.out or (conda_lock_path(stack.name) if args.kind == "conda"
                            else lock_path(stack.name)))

    def say_wait(owner) -> None:
        print(targetlock.waiting_line(out, owner), flush=True)

    with targetlock.hold(out, "dsenv lock", wait=getattr(args, "wait", None),
                         on_wait=say_wait):
        return _run_lock(args, stack, out)


def _run_lock(args, stack, out: Path) -> int:
    if args.kind == "conda":
        out = lock_conda(recipe_path(stack.name), out, conda_exe=args.conda)
    else:
        sources = stack_sources(stack, args.find_links, args.index_url)
        command = ["dsenv lock --stack", stack.name]
        command += [f"--find-links {link}" for link in sources.find_links]
        if args.index_url:
            command.append(f"--index-url {args.index_url}")
        out = compile_lock(requirements_path(stack.name), out, python_platform=LINUX_X86_64,
                           sources=sources, regenerate=" ".join(command), upgrade=args.upgrade)
    print(f"dsenv lock: wrote {out}")
    return 0


def run_openmpi(args, argv: list[str]) -> int:
    given = [f"--{name.replace('_', '-')}" for name in ENV_OPTIONS if getattr(args, name, None)]
    given += [f"--{name.replace('_', '-')}" for name in ENV_FLAGS if getattr(args, name, False)]
    if given:
        raise ProvisionError(f"{', '.join(given)} belong to `dsenv provision` (Python "
                             "environments), not to `dsenv provision openmpi`: see "
                             "`dsenv provision openmpi --help`")
    build = make_build(args)
    if args.ompi_dry_run or args.dry_run:
        print(build.render())
        return 0
    for line in build.header():
        print(line)
    return provision_openmpi(build, argv, getattr(args, "wait", None))
