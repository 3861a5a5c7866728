"""provision.record.modulefile: a provisioned environment as an Lmod module
(`dsenv provision ... --modulefile DIR`), loaded and unloaded by the real Lmod Debian ships.

Fast: the rendered file (values escaped, keep-if-set variables, site modules as depends_on),
and the same settings as the activate script, for real: a bash login shell sources the
activate script and another loads the module, with the same variables before; both print
what they set and must agree; `module unload` puts every one back (PATH exactly).
Slow: `dsenv provision --arch cpu --ops none --modulefile DIR` (~10-30 s with a warm uv
cache), then in batch shells: `module load` -> the env's python imports deepspeed, `dsenv
doctor --json` judges that environment, `module unload` restores PATH; an Open MPI module
recorded into the environment is a depends_on of it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dsenv.envs.sites import load_site
from dsenv.envs.stacks import get_stack
from dsenv.provision import ProvisionError
from dsenv.provision.openmpi import record as openmpi_record
from dsenv.provision.record import modulefile
from dsenv.provision.record.activation import render_activation
from dsenv.provision.record.settings import environment_settings
from dsenv.provision.targets import resolve_arch
from tests.harness.cli import dsenv

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
LOCAL_TORCH = Path("/opt/wheels")
needs_lmod = pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod needed (apt-get install "
                                                                  "lmod)")
SHOWN = ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "DSENV_ENV", "PYTHONHOME",
         "TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST", "PYTORCH_ROCM_ARCH", "DS_ACCELERATOR",
         "HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
         "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "OMP_NUM_THREADS", "MIOPEN_USER_DB_PATH",
         "FI_CXI_DISABLE_CQ_HUGETLB", "HOOKED", "ODD", "FAKE_MODULES", "PATH")
PRINT = "; ".join(f'printf "%s=%s\\n" {v} "${{{v}-UNSET}}"' for v in SHOWN)
ABOUT = {"site": "x", "stack": "cpu", "torch": "torch==2", "deepspeed": "0.1",
         "archs": "cpu", "lock": "cpu.txt", "lock_sha256": "ab" * 32, "ops": "none"}


def login_shell(script: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """``bash -lc`` (a batch shell: `module` from the login profile, else Lmod's init) with
    exactly ``env``; PATH's duplicates removed first (Lmod removes them at its first change
    of PATH unless the site sets LMOD_DUPLICATE_PATHS=yes)."""
    prelude = (f"type module >/dev/null 2>&1 || . {LMOD_INIT}\n"
               "PATH=$(printf %s \"$PATH\" | awk -v RS=: '!seen[$0]++' | paste -sd: -)\n")
    return subprocess.run(["bash", "-lc", prelude + script], env=env, capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def values(text: str, mark: str) -> dict:
    block = text.split(f"=== {mark}\n", 1)[1].split("=== ", 1)[0]
    return dict(line.split("=", 1) for line in block.splitlines() if "=" in line)


def fake_modules(root: Path, names) -> None:
    """Lua modules that only mark their loading (FAKE_MODULES lists them)."""
    for name in names:
        path = root / f"{name}.lua"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'append_path("FAKE_MODULES", "{name}")\n')


# -- the rendered file ---------------------------------------------------------------------
def test_lua_strings_cannot_end_early_or_run_code():
    assert modulefile.lua_str('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\001"'
    text = modulefile.lua_str('x"); os.execute("touch /tmp/pwn") --')
    assert text.startswith('"x\\");') and text.endswith('--"')
    assert modulefile._unquote(modulefile.lua_str('/a "b"\\\n\x02c')) == '/a "b"\\\n\x02c'


def test_modulefile_of_a_rocm_site_renders_its_settings(tmp_path):
    site = load_site("lumi")
    groups = environment_settings(tmp_path / "env", site, resolve_arch("gfx90a"),
                                  get_stack("rocm7.2"), kind="venv")
    text = modulefile.render_modulefile(groups, module="dsenv-rocm7.2/12345678-gfx90a",
                                        prefix=tmp_path / "env", about=ABOUT)
    env = tmp_path / "env"
    assert ('if isloaded("PrgEnv-cray") then unload("PrgEnv-cray") end\n'
            'depends_on("PrgEnv-gnu")') in text  # the site's `module swap`
    assert f'pushenv("VIRTUAL_ENV", "{env}")' in text
    assert f'prepend_path("PATH", "{env}/bin")' in text
    assert 'pushenv("PYTHONHOME", false)' in text  # unset, restored on unload
    assert f'pushenv("DSENV_ENV", "{env}")' in text
    assert f'pushenv("TORCH_EXTENSIONS_DIR", "{env}/torch_extensions")' in text
    assert 'setenv("PYTORCH_ROCM_ARCH", "gfx90a", true)' in text  # a user's value wins
    assert 'setenv("NCCL_SOCKET_IFNAME", "hsn", true)' in text
    # "/tmp/${USER:-user}-miopen-cache-${SLURM_NODEID:-0}": expanded when the module loads
    assert ('setenv("MIOPEN_USER_DB_PATH", "/tmp/" .. dsenv_expand("USER", ":-", "user") .. '
            '"-miopen-cache-" .. dsenv_expand("SLURM_NODEID", ":-", "0"), true)') in text
    assert 'if (os.getenv("SLURM_JOB_ID") or "") ~= "" then\n   pushenv("HF_HUB_OFFLINE", "1")' \
        in text
    assert 'whatis("Lock: cpu.txt sha256 ' + "ab" * 32 + '")' in text
    assert 'pushenv("DSENV_MODULE", "dsenv-rocm7.2/12345678-gfx90a")' in text
    assert modulefile.modulefile_prefix(text) == str(env)


def test_names_versions_and_refusals(tmp_path):
    gpu, cpu = resolve_arch("8.0;9.0"), resolve_arch("cpu")
    sha = "0123456789abcdef" * 4
    plan = modulefile.plan_modulefile(str(tmp_path / "m"), None, "", "generic", "cuda13.0",
                                      sha, gpu)
    assert plan.module == "dsenv-cuda13.0/01234567-sm80-sm90"
    assert plan.path == tmp_path / "m" / "dsenv-cuda13.0" / "01234567-sm80-sm90.lua"
    assert modulefile.plan_modulefile(None, None, "", "generic", "cpu", sha, cpu) is None
    site = modulefile.plan_modulefile(None, None, "${MODROOT}/mods", "hpc", "cpu", sha, cpu,
                                      env={"MODROOT": str(tmp_path)})
    assert site.path == tmp_path / "mods" / "dsenv-cpu" / "01234567.lua"
    assert site.source == "site hpc"
    assert modulefile.plan_modulefile("none", None, "/x", "hpc", "cpu", sha, cpu) is None
    named = modulefile.plan_modulefile(str(tmp_path), "deepspeed/0.18-cpu", "", "g", "cpu",
                                       "", cpu)
    assert named.module == "deepspeed/0.18-cpu"
    with pytest.raises(ProvisionError, match="give NAME/VERSION"):
        modulefile.plan_modulefile(str(tmp_path), "../x", "", "g", "cpu", sha, cpu)
    with pytest.raises(ProvisionError, match="unset variable"):
        modulefile.plan_modulefile(None, None, "$NOPE_UNSET/m", "hpc", "cpu", sha, cpu, env={})
    # another environment's modulefile is not overwritten without --force
    plan.path.parent.mkdir(parents=True)
    plan.path.write_text('pushenv("DSENV_ENV", "/apps/other")\n')
    with pytest.raises(ProvisionError, match=r"loads another environment \(/apps/other\)"):
        modulefile.check_modulefile(plan, Path("/apps/mine"), force=False)
    modulefile.check_modulefile(plan, Path("/apps/other"), force=False)  # its own: rewritten
    modulefile.check_modulefile(plan, Path("/apps/mine"), force=True)


def test_dry_run_shows_the_modulefile_step(tmp_path):
    done = dsenv("provision", "--arch", "cpu", "--ops", "none", "--prefix", tmp_path / "env",
                 "--modulefile", tmp_path / "mods", "--dry-run", env={"COLUMNS": "250"})
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"^- modulefile (dsenv-cpu/[0-9a-f]{8}) at (\S+\.lua): Lmod Lua from "
                      r"the settings the activate script renders", done.stdout, re.MULTILINE)
    assert match, done.stdout
    assert match.group(2) == f"{tmp_path}/mods/{match.group(1)}.lua"
    assert f"module use {tmp_path / 'mods'}; module load {match.group(1)}" in done.stdout
    assert not (tmp_path / "mods").exists() and not (tmp_path / "env").exists()


# -- the same settings as the activate script, through real shells -------------------------------
CASES = {  # site, --arch, stack, kind
    "lumi": ("lumi", "gfx90a", "rocm7.2", "venv"),
    "daint": ("daint", "P100", "cuda12.6", "venv"),
    "hpc5-conda": ("hpc5", "V100", "cuda12.6", "conda"),
    "generic-cpu": ("generic", "cpu", "cpu", "venv"),
}


@needs_lmod
@pytest.mark.parametrize("case", list(CASES))
def test_module_sets_what_activate_sets_and_unloads_cleanly(case, tmp_path):
    site_name, arch, stack, kind = CASES[case]
    site = load_site(site_name)
    site = replace(site, env={**site.env, "ODD": 'a "quoted" $HOME \\ `x` ; value'})
    prefix = tmp_path / "my env"
    (prefix / "bin").mkdir(parents=True)
    if kind == "conda":
        hooks = prefix / "etc" / "conda" / "activate.d"
        hooks.mkdir(parents=True)
        (hooks / "hook.sh").write_text("export HOOKED=yes\n")
    target, stack = resolve_arch(arch), get_stack(stack)
    (prefix / "activate").write_text(render_activation(prefix, site, target, stack, kind=kind))
    groups = environment_settings(prefix, site, target, stack, kind=kind)
    mods = tmp_path / "mods"
    (mods / "dsenv-x").mkdir(parents=True)
    (mods / "dsenv-x" / "1.lua").write_text(modulefile.render_modulefile(
        groups, module="dsenv-x/1", prefix=prefix, about=ABOUT))
    names = [w for words in site.module_commands() for w in words[1:]]
    fake_modules(mods, names)
    env = {"HOME": str(tmp_path), "USER": "ada", "SLURM_JOB_ID": "42", "SLURM_NODEID": "3",
           "SCRATCH": "/scratch/ada", "NCCL_SOCKET_IFNAME": "mine", "PYTHONHOME": "/old/home",
           "DS_ACCELERATOR": "before", "MODULEPATH": str(mods), "LMOD_REDIRECT": "no"}
    # a site's `module swap A B` needs A loaded (as a Cray login shell has PrgEnv-cray)
    swapped = [words[1] for words in site.module_commands() if words[0] == "swap"]
    script = "".join(f"module load {name}\n" for name in swapped) + f"""
echo "=== before"; {PRINT}
( . "{prefix}/activate"; echo "=== activate"; {PRINT} )
module load dsenv-x/1 || exit 9
echo "=== module"; {PRINT}; echo "DSENV_MODULE=$DSENV_MODULE"
module unload dsenv-x/1 || exit 8
echo "=== unloaded"; {PRINT}
"""
    done = login_shell(script, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    before, activated = values(done.stdout, "before"), values(done.stdout, "activate")
    loaded, unloaded = values(done.stdout, "module"), values(done.stdout, "unloaded")
    assert loaded.pop("DSENV_MODULE") == "dsenv-x/1"  # the one thing only the module sets
    assert loaded == activated, {k: (activated[k], loaded[k]) for k in activated
                                 if loaded[k] != activated[k]}
    if swapped:  # Lmod's modulefiles cannot swap back: the old module stays unloaded
        assert unloaded.pop("FAKE_MODULES") == "UNSET" and before.pop("FAKE_MODULES")
    assert unloaded == before, {k: (before[k], unloaded[k]) for k in before
                                if unloaded[k] != before[k]}
    assert loaded["PATH"].startswith(f"{prefix}/bin:") and loaded["DSENV_ENV"] == str(prefix)
    assert loaded["NCCL_SOCKET_IFNAME"] == "mine"  # the user's own value wins
    assert loaded["PYTHONHOME"] == ("UNSET" if kind == "venv" else "/old/home")
    # a site value: $HOME expanded (as sh does), quotes, backslash and backquote literal
    assert loaded["ODD"] == f'a "quoted" {tmp_path} \\ `x` ; value'
    assert loaded["HF_HUB_OFFLINE"] == "1"  # inside a Slurm job
    if names:
        assert loaded["FAKE_MODULES"] != "UNSET"
    if kind == "conda":
        assert loaded["HOOKED"] == "yes" and loaded["CONDA_PREFIX"] == str(prefix)
    if site_name == "lumi":
        assert loaded["MIOPEN_USER_DB_PATH"] == "/tmp/ada-miopen-cache-3"
    if site_name == "daint":
        assert loaded["OMP_NUM_THREADS"] == "1" and loaded["TORCH_CUDA_ARCH_LIST"] == "6.0"
        assert loaded["HF_HOME"] == "/scratch/ada/huggingface"


# -- a real environment ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def provisioned(tmp_path_factory):
    """`dsenv provision --arch cpu --ops none --modulefile DIR`: (prefix, DIR, module)."""
    root = tmp_path_factory.mktemp("modenv")
    prefix, mods = root / "env", root / "modulefiles"
    links = ["--find-links", str(LOCAL_TORCH)] if LOCAL_TORCH.is_dir() else []
    done = dsenv("provision", "--arch", "cpu", "--ops", "none", "--no-bytecode", "--prefix",
                 prefix, "--modulefile", mods, *links, env={"COLUMNS": "250"}, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    module = re.search(r"module load (dsenv-cpu/[0-9a-f]{8})`", done.stdout).group(1)
    return prefix, mods, module


@pytest.mark.slow
@needs_lmod
def test_provisioned_env_loads_imports_deepspeed_and_unloads(provisioned, tmp_path):
    prefix, mods, module = provisioned
    path = mods / f"{module}.lua"
    assert path.is_file() and not list(path.parent.glob(".*"))  # nothing half-written left
    record = json.loads((prefix / "dsenv-env.json").read_text())[modulefile.MANIFEST_KEY]
    assert record == {"path": str(path), "module": module, "root": str(mods)}
    sha = json.loads((prefix / "dsenv-env.json").read_text())["lock"]["sha256"]
    assert module.endswith(sha[:8])
    report = tmp_path / "doctor.json"
    script = f"""
before="$PATH"
module use {mods}
module load {module} || exit 9
python -c 'import deepspeed, sys; print("prefix=" + sys.prefix)'
module whatis {module} 2>&1
{sys.executable} -m dsenv doctor --json > {report}; echo "doctor=$?"
module unload {module} || exit 8
[ "$PATH" = "$before" ] && echo "PATH restored" || echo "PATH differs: $PATH"
echo "DSENV_ENV=${{DSENV_ENV-UNSET}} VIRTUAL_ENV=${{VIRTUAL_ENV-UNSET}}"
"""
    env = {"HOME": str(tmp_path), "USER": "ada", "LMOD_REDIRECT": "no",
           "DSENV_CACHE_DIR": str(tmp_path / "cache")}
    done = login_shell(script, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert f"prefix={prefix}\n" in done.stdout
    assert "PATH restored" in done.stdout, out
    assert "DSENV_ENV=UNSET VIRTUAL_ENV=UNSET" in done.stdout
    assert f"Lock: cpu.txt sha256 {sha}" in out  # whatis
    assert "Ops: none precompiled (--ops none)" in out
    doc = json.loads(report.read_text())
    environment = doc["environment"]
    assert environment["prefix"] == str(prefix) and environment["source"] == "DSENV_ENV"
    assert environment["chosen_by"] == f"DSENV_ENV={prefix}, module {module}"
    drift = next(r for r in doc["results"] if r["id"] == "python.env-drift")
    assert drift["status"] == "ok" and "as provisioned (stack cpu" in drift["summary"]


@pytest.mark.slow
@needs_lmod
def test_recorded_open_mpi_is_a_dependency_of_the_module(provisioned, tmp_path):
    """`dsenv provision openmpi --env PREFIX` writes its module into the env's modulefile
    (the same function its record step calls): loading the env loads Open MPI's module
    from EasyBuild's MODULEPATH, unloading unloads it."""
    prefix, mods, module = provisioned
    easybuild = tmp_path / "eb" / "modules" / "all"
    fake_modules(easybuild, ["OpenMPI/4.1.4-slurm-pmix"])
    manifest = json.loads((prefix / "dsenv-env.json").read_text())
    record = {"module": "OpenMPI/4.1.4-slurm-pmix", "modulepath": str(easybuild)}
    path = mods / f"{module}.lua"
    original = path.read_text()
    try:
        for _ in range(2):  # recorded twice: one block
            target, text = openmpi_record._modulefile_text(manifest, record)
            assert target == path
            path.write_text(text)
        assert path.read_text().count(modulefile.BLOCK_BEGIN) == 1
        script = f"""
module use {mods}
module load {module} || exit 9
echo "loaded=$FAKE_MODULES"; module -t list 2>&1
module unload {module} || exit 8
echo "after=${{FAKE_MODULES-UNSET}}"; module -t list 2>&1
"""
        done = login_shell(script, {"HOME": str(tmp_path), "LMOD_REDIRECT": "no"}, tmp_path)
    finally:
        path.write_text(original)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded=OpenMPI/4.1.4-slurm-pmix" in done.stdout
    loaded, unloaded = done.stdout.split("after=")
    assert f"OpenMPI/4.1.4-slurm-pmix\n{module}" in loaded  # `module -t list`
    assert unloaded.startswith("UNSET") and "OpenMPI" not in unloaded and module not in unloaded
