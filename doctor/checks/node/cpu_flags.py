"""deepspeed.cpu-flags: this node's CPU has every flag the environment's CPU ops were
compiled for.

DeepSpeed compiles its CPU ops with -march=native (dsenv/facts/toolchain/cpu_isa.py), so an op built
on a newer CPU uses instructions an older node lacks, and the job dies there with SIGILL
("Illegal instruction (core dumped)") the first time the op runs, typically in the first
optimizer step of DeepSpeedCPUAdam. `dsenv provision` records the flags in the environment's
manifest (ops.cpu_flags); this check compares them with /proc/cpuinfo.
"""

from __future__ import annotations

from pathlib import Path

from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.host import machine as host
from dsenv.facts.python import target_env
from dsenv.facts.toolchain import cpu_isa
from dsenv.provision import ProvisionError
from dsenv.provision.record import manifest as env_manifest
from dsenv.verdicts.findings import fail, ok, skip, warn


@check("deepspeed.cpu-flags", "CPU flags the precompiled CPU ops need")
def cpu_flags(ctx: Context):
    prefix = Path(target_env.environment(ctx).prefix)
    try:
        recorded = env_manifest.read_manifest(prefix)
    except ProvisionError as exc:
        return skip(f"the environment's manifest cannot be read ({exc}); python.env-drift "
                    "says how to fix it")
    if recorded is None:
        return skip(f"not provisioned by dsenv (no {env_manifest.MANIFEST_NAME} in {prefix}): "
                    "no record of the CPU its ops were compiled for")
    required, record = env_manifest.required_cpu_flags(recorded)
    ops = ", ".join(record.get("ops") or ()) or "the CPU ops"
    command = " ".join(recorded.command) if recorded.command else "dsenv provision ..."
    if "--force" not in recorded.command:
        command += " --force"
    if not record:
        return skip("no precompiled op of this environment was compiled with -march=native")
    built_on = (f"compiled on {record.get('host', '?')} with -march=native "
                f"(-march={record.get('march') or '?'}) for {ops}")
    if not required:
        return warn(f"{ops} were compiled with -march=native, but the build host's compiler "
                    "did not say which CPU flags that enabled: nothing to compare",
                    f"re-provision so the manifest records them: `{command}`", built_on)
    cpu = host.cpu(ctx)
    missing = cpu_isa.missing_flags(required, cpu.flags)
    evidence = [built_on, f"this node: {cpu.model}, {len(cpu.flags)} flags in /proc/cpuinfo",
                "required: " + " ".join(required)]
    if not missing:
        return ok(f"this CPU has all {len(required)} flags {ops} were compiled for "
                  f"(-march={record.get('march') or 'native'} on {record.get('host', '?')})",
                  *evidence)
    shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6
                                       else "")
    fix = (f"build the environment on this node type: run `{command}` on a {cpu.model} node "
           "(or on the oldest CPU type the job may land on), or keep the job on nodes like "
           f"{record.get('host', 'the build host')} (Slurm --constraint / --partition)")
    summary = (f"this CPU lacks {len(missing)} flag(s) {ops} were compiled for ({shown}): "
               "the job dies with SIGILL (illegal instruction) when the op runs")
    if not ctx.is_compute:
        return warn(summary + "; fine if the job's compute nodes have them", fix,
                    *evidence, "missing here: " + " ".join(missing))
    return fail(summary, fix, *evidence, "missing here: " + " ".join(missing))
