"""`dsenv provision openmpi`: the generated easyconfig read by EasyBuild's own parser, real
`eb --dry-run` / `eb -x` on it offline, one line for every kind of bad input, a failing eb that
leaves no build behind, the module recorded in an environment's activate script and loaded by
Lmod in bash, and (opt-in, DSENV_EB_REAL_BUILD=1, ~20 min) the real build judged by the doctor.

eb never reaches the network: its proxies point at a closed loopback port (127.0.0.1:9) and its
build/repository paths live in the test's temporary folder (EASYBUILD_PREFIX). Source tarballs
for the dry runs are tiny ones with the right name: neither `eb -D` nor `eb -x` verifies
checksums, the real eb run does (test_failed_eb_...).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.openmpi import (
    options as openmpi_options,
)
from dsenv.provision.openmpi import (
    provide as openmpi,
)
from dsenv.provision.openmpi import (
    record as openmpi_record,
)
from dsenv.provision.openmpi.options import contradictions, find_system_pmix
from tests.harness.cli import dsenv
from tests.harness.cli import one_line as _one_line

EB = shutil.which("eb")
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
DEBIAN_OMPI = Path("/usr/bin/ompi_info")
needs_eb = pytest.mark.skipif(EB is None
                              or openmpi_options.find_modules_tool(os.environ) is None,
                              reason="EasyBuild (pip install easybuild) or Lmod (apt-get "
                                     "install lmod) missing")
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "no_proxy": "", "NO_PROXY": ""}
SYSTEM_MODULE = "OpenMPI/4.1.4-slurm-pmix"


@pytest.fixture
def eb_env(tmp_path) -> dict:
    """eb offline, as root when the tests run as root, its paths in the test's folder."""
    return {**OFFLINE, "EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES": "1",
            "EASYBUILD_PREFIX": str(tmp_path / "eb-prefix"), "COLUMNS": "5000"}


def one_line(done) -> str:
    return _one_line(done, "dsenv provision openmpi: ")


def tiny_tarball(folder: Path, name: str, top: str) -> Path:
    """A small tarball named like a real source (``top``/configure inside)."""
    folder.mkdir(parents=True, exist_ok=True)
    tree = folder / ".tree" / top
    tree.mkdir(parents=True)
    (tree / "configure").write_text("#!/bin/sh\nexit 1\n")
    mode = "w:xz" if name.endswith(".xz") else "w:bz2"
    with tarfile.open(folder / name, mode) as tar:
        tar.add(tree, arcname=top)
    shutil.rmtree(folder / ".tree")
    return folder / name


def dry_run_parts(stdout: str) -> tuple[Path, str, list[str], dict]:
    """(easyconfig path, easyconfig text, eb argv, eb variables) from a --dry-run print."""
    match = re.search(r"^----- easyconfig (\S+) -----\n(.*?)^----- end of easyconfig -----",
                      stdout, re.S | re.M)
    assert match, stdout
    command = next(line[2:] for line in stdout.splitlines() if line.startswith("$ "))
    words = shlex.split(command)
    variables = {}
    while "=" in words[0] and not words[0].startswith("/"):
        name, _, value = words.pop(0).partition("=")
        variables[name] = value
    return Path(match.group(1)), match.group(2), words, variables


def parse_easyconfig(path: Path) -> dict:
    from easybuild.framework.easyconfig.parser import EasyConfigParser

    return EasyConfigParser(str(path)).get_config_dict()


CHOICES = {
    "system-pmix": dict(args=[], version="4.1.4", toolchain={"name": "system"},
                        source="openmpi_4.1.4.orig.tar.xz", top="openmpi-4.1.4",
                        module=SYSTEM_MODULE,
                        opts=["--with-slurm", "--with-libevent=external",
                              "--with-hwloc=external", "--disable-mpi-fortran"],
                        pmix_check="mca:pmix:ext", dependencies=None),
    "gcc-eb-pmix": dict(args=["--version", "4.1.6", "--toolchain", "GCC/13.2.0", "--pmix",
                              "eb:PMIx/4.2.6-GCCcore-13.2.0", "--robot"],
                        version="4.1.6", toolchain={"name": "GCC", "version": "13.2.0"},
                        source="openmpi-4.1.6.tar.bz2", top="openmpi-4.1.6",
                        module="OpenMPI/4.1.6-GCC-13.2.0-slurm-pmix",
                        opts=["--with-slurm", "--with-pmix=$EBROOTPMIX",
                              "--with-libevent=$EBROOTLIBEVENT", "--with-hwloc=$EBROOTHWLOC"],
                        pmix_check="mca:pmix:ext",
                        dependencies=[("PMIx", "4.2.6", "", ("GCCcore", "13.2.0"))]),
    "internal-pmix": dict(args=["--pmix", "internal"], version="4.1.4",
                          toolchain={"name": "system"}, source="openmpi_4.1.4.orig.tar.xz",
                          top="openmpi-4.1.4", module=SYSTEM_MODULE,
                          opts=["--with-slurm", "--with-pmix=internal",
                                "--with-libevent=internal", "--with-hwloc=internal"],
                          pmix_check="mca:pmix:pmix", dependencies=None),
}


def system_pmix_dir() -> str:
    found = find_system_pmix()
    if found is None:
        pytest.skip("no system PMIx (apt-get install libpmix-dev)")
    return found[0]


# -- the easyconfig ---------------------------------------------------------------------------
@needs_eb
@pytest.mark.parametrize("choice", list(CHOICES))
def test_easyconfig_parses_with_easybuilds_parser(tmp_path, choice, eb_env):
    case = CHOICES[choice]
    wanted = case["opts"] + ([f"--with-pmix={system_pmix_dir()}"]
                             if choice == "system-pmix" else [])
    sources = tmp_path / "src"
    tiny_tarball(sources, case["source"], case["top"])
    done = dsenv("provision", "openmpi", "--dry-run", *case["args"], "--sourcepath", sources,
                 "--installpath", tmp_path / "inst", env=eb_env)
    assert done.returncode == 0, done.stderr
    path, text, _, _ = dry_run_parts(done.stdout)
    assert not (tmp_path / "inst").exists(), "--dry-run wrote into the installpath"
    path = tmp_path / path.name
    path.write_text(text)
    config = parse_easyconfig(path)

    assert (config["name"], config["version"], config["versionsuffix"]) == \
        ("OpenMPI", case["version"], "-slurm-pmix")
    if case["toolchain"]["name"] == "system":
        assert config["toolchain"]["name"] == "system"
    else:
        assert config["toolchain"] == case["toolchain"]
    assert config["easyblock"] == "ConfigureMake"
    assert config["sources"] == [case["source"]]
    [checksum] = config["checksums"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum[case["source"]])
    opts = config["configopts"].split()
    for expected in wanted:
        assert expected in opts, (expected, opts)
    assert contradictions(opts) == []
    assert len([o for o in opts if o.startswith("--with-pmix")]) == 1
    assert config.get("dependencies") == case["dependencies"]
    checks = config["sanity_check_commands"]
    for framework in ("ras", "plm", "ess"):
        assert any(f"mca:{framework}:slurm:" in c for c in checks), checks
    assert sum(case["pmix_check"] in c for c in checks) == 1, checks
    assert "bin/ompi_info" in config["sanity_check_paths"]["files"]
    assert config["moduleclass"] == "mpi"
    assert f"module load {case['module']}" in done.stdout


@needs_eb
def test_open_mpi_5_checks_slurm_through_prrte(tmp_path, eb_env):
    """Open MPI 5 has no ras/plm/ess in ompi_info (PRRTE launches) and no pmix framework."""
    done = dsenv("provision", "openmpi", "--dry-run", "--version", "5.0.10", "--pmix",
                 "internal", "--installpath", tmp_path / "inst", env=eb_env)
    assert done.returncode == 0, done.stderr
    path, text, _, _ = dry_run_parts(done.stdout)
    (tmp_path / path.name).write_text(text)
    config = parse_easyconfig(tmp_path / path.name)
    checks = config["sanity_check_commands"]
    for framework in ("ras", "plm", "ess"):
        assert f"prte_info | grep -q 'MCA {framework}: slurm'" in checks
    assert not any("mca:" in c for c in checks)
    assert any(c.startswith("ldd %(installdir)s/lib/libmpi.so") for c in checks)
    assert config["sources"] == ["openmpi-5.0.10.tar.bz2"]
    assert "--with-pmix=internal" in config["configopts"].split()


def test_contradictory_configure_options_are_found():
    assert contradictions(["--with-pmix=internal", "--with-pmix=/usr"]) == \
        ["--with-pmix: internal and /usr"]
    assert contradictions(["--enable-shared", "--disable-shared"])
    assert contradictions(["--with-slurm", "--without-slurm"])
    assert contradictions(["--with-slurm", "--enable-shared", "--with-pmix=/x",
                           "--with-hwloc=external", "--disable-mpi-fortran"]) == []


def test_upstream_checksums_are_easybuilds_own():
    """The data file's upstream sha256 values equal those of EasyBuild's stock OpenMPI
    easyconfigs (installed with easybuild-easyconfigs)."""
    from importlib import metadata

    try:
        files = metadata.distribution("easybuild-easyconfigs").files or []
    except metadata.PackageNotFoundError:
        pytest.skip("easybuild-easyconfigs not installed")
    stock: dict[str, str] = {}
    for file in files:
        if re.search(r"easyconfigs/o/OpenMPI/OpenMPI-[\d.]+-GCC-[\d.]+\.eb$", str(file)):
            for entry in parse_easyconfig(Path(file.locate()))["checksums"]:
                if isinstance(entry, dict):
                    stock.update(entry)
    compared = 0
    for version, entry in openmpi_options.table()["versions"].items():
        for source in entry["sources"]:
            if source["file"] == f"openmpi-{version}.tar.bz2":
                assert stock.get(source["file"]) == source["sha256"], source["file"]
                compared += 1
    assert compared == len(openmpi_options.table()["versions"])


# -- real eb, offline -------------------------------------------------------------------------
@needs_eb
@pytest.mark.parametrize("choice", list(CHOICES))
def test_eb_dry_run_and_extended_dry_run_offline(tmp_path, choice, eb_env):
    case = CHOICES[choice]
    sources = tmp_path / "src"
    tarball = tiny_tarball(sources, case["source"], case["top"])
    installpath = tmp_path / "inst"
    done = dsenv("provision", "openmpi", "--dry-run", *case["args"], "--sourcepath", sources,
                 "--installpath", installpath, env=eb_env)
    assert done.returncode == 0, done.stderr
    path, text, command, variables = dry_run_parts(done.stdout)
    assert not installpath.exists()
    assert variables["EASYBUILD_MODULES_TOOL"] == "Lmod" and Path(variables["LMOD_CMD"]).is_file()
    # the easyconfig where dsenv would write it, then eb exactly as dsenv prints it
    path.parent.mkdir(parents=True)
    path.write_text(text)
    env = {**os.environ, **eb_env, **variables}

    began = time.monotonic()
    resolved = subprocess.run([*command, "-D"], capture_output=True, text=True, timeout=300,
                              env=env)
    dry_seconds = time.monotonic() - began
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    assert f"(module: {case['module']})" in resolved.stdout
    if case["dependencies"]:  # --robot resolved the PMIx module from EasyBuild's easyconfigs
        assert "(module: PMIx/4.2.6-GCCcore-13.2.0)" in resolved.stdout
        assert "(module: GCC/13.2.0)" in resolved.stdout

    # -x of this easyconfig alone (with --robot it would dry-run every dependency too)
    extended = subprocess.run([*(w for w in command if w != "--robot"), "-x"],
                              capture_output=True, text=True, timeout=300, env=env)
    out = extended.stdout + extended.stderr
    assert extended.returncode == 0, out
    assert f"{case['source']} found at {tarball}" in out
    configure = next(line for line in out.splitlines() if '"./configure ' in line)
    configure = configure.replace('"', " ")
    assert f"--prefix={installpath}/software/{case['module']}" in configure
    for expected in case["opts"]:
        assert expected in configure.split(), (expected, configure)
    if choice == "system-pmix":
        assert f"--with-pmix={system_pmix_dir()}" in configure
    if case["dependencies"]:
        assert "module load PMIx/4.2.6-GCCcore-13.2.0 [SIMULATED]" in out
    assert f"generating module file @ {installpath}/modules/all/{case['module']}.lua" in out
    assert dry_seconds < 60


@needs_eb
def test_dry_run_before_the_word_openmpi_is_still_a_dry_run(tmp_path, eb_env):
    done = dsenv("provision", "--dry-run", "openmpi", "--installpath", tmp_path / "inst",
                 env=eb_env)
    assert done.returncode == 0, done.stderr
    assert "----- easyconfig " in done.stdout and not (tmp_path / "inst").exists()
    assert "eb downloads it" in done.stdout  # no source in eb's (empty) source path


def test_provision_without_openmpi_is_unchanged(tmp_path):
    from dsenv.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["provision", "--arch", "7.0", "--ops", "none"])
    assert (args.provision_what, args.arch, args.ops) == (None, "7.0", "none")
    args = parser.parse_args(["provision", "openmpi", "--version", "4.1.6", "--dry-run"])
    assert (args.provision_what, args.ompi_version, args.ompi_dry_run) == ("openmpi", "4.1.6",
                                                                           True)
    # the environment command still answers `--arch 7.0` itself: its plan, or its own line
    # (here: CUDA 13's nvcc cannot build sm_70)
    done = dsenv("provision", "--arch", "7.0", "--dry-run", "--prefix", tmp_path / "env")
    if done.returncode == 0:
        assert "dsenv provision: venv environment at" in done.stdout
    else:
        assert done.stderr.startswith("dsenv provision: ") and "usage:" not in done.stderr
    assert "----- easyconfig" not in done.stdout
    assert not (tmp_path / "env").exists()


def test_the_doctors_fix_names_a_command_that_exists():
    from dsenv.doctor.checks.job.mpi import PROVISION_FIX

    command = re.search(r"`(dsenv provision openmpi)`", PROVISION_FIX).group(1)
    done = dsenv(*command.split()[1:], "--help")
    assert done.returncode == 0 and "--with-slurm" in done.stdout


# -- bad input: one line, exit 2, nothing written ----------------------------------------------
@pytest.mark.parametrize("args, expected", [
    (["--version", "9.9.9"], "--version 9.9.9: dsenv knows Open MPI 4.1.4, 4.1.5"),
    (["--toolchain", "intel/2023.1"], "dsenv builds Open MPI with SYSTEM or GCC/VERSION"),
    (["--toolchain", "GCC"], "--toolchain GCC: expected SYSTEM or NAME/VERSION"),
    (["--pmix", "slurm"], "--pmix slurm: expected system, system:DIR, eb:PMIx/VERSION"),
    (["--pmix", "eb:PMIx/4.2.6-GCCcore-13.2.0"], "needs a compiler toolchain"),
    (["--toolchain", "GCC/13.2.0", "--pmix", "eb:pmix-4"], "expected eb:PMIx/VERSION"),
    (["--pmix", "system:/nonexistent/pmix"], "/nonexistent/pmix/include/pmix.h does not exist"),
    (["--pmix", "internal:x"], "internal takes no argument"),
    (["--sourcepath", "/nonexistent/sources"], "--sourcepath /nonexistent/sources: no such"),
    (["--eb", "/nonexistent/eb"], "--eb /nonexistent/eb: not an executable file"),
    (["--env", "/nonexistent/env"], "no activate or dsenv-env.json there"),
])
def test_bad_input_is_one_line(tmp_path, args, expected, eb_env):
    installpath = tmp_path / "inst"
    done = dsenv("provision", "openmpi", *args, "--installpath", installpath, env=eb_env)
    assert expected in one_line(done)
    assert not installpath.exists()


def test_environment_options_do_not_mix_with_openmpi(tmp_path):
    done = dsenv("provision", "--arch", "cpu", "--force", "openmpi", "--installpath",
                 tmp_path / "inst")
    assert "--arch, --force belong to `dsenv provision`" in one_line(done)


def test_missing_source_names_the_file_and_how_to_get_it(tmp_path, eb_env):
    (tmp_path / "src").mkdir()
    installpath = tmp_path / "inst"
    line = one_line(dsenv("provision", "openmpi", "--sourcepath", tmp_path / "src",
                          "--installpath", installpath, env=eb_env))
    assert "has no openmpi-4.1.4.tar.bz2 or openmpi_4.1.4.orig.tar.xz" in line
    assert "apt-get source --download-only openmpi" in line
    assert "https://download.open-mpi.org/release/open-mpi/v4.1/openmpi-4.1.4.tar.bz2" in line
    assert not installpath.exists()
    # the dry run reports the same as a note and still prints the plan
    done = dsenv("provision", "openmpi", "--dry-run", "--sourcepath", tmp_path / "src",
                 "--installpath", installpath, env=eb_env)
    assert done.returncode == 0 and "note       --sourcepath" in done.stdout
    assert not installpath.exists()


def test_no_eb_on_path(tmp_path, eb_env):
    bare = {**eb_env, "PATH": "/usr/bin:/bin"}
    if shutil.which("eb", path=bare["PATH"]):
        pytest.skip("eb is installed in /usr/bin")
    line = one_line(dsenv("provision", "openmpi", "--installpath", tmp_path / "inst", env=bare))
    assert line.startswith("no `eb` on PATH: install EasyBuild (`pip install easybuild`")
    assert not (tmp_path / "inst").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_root_without_easybuilds_consent_variable(tmp_path, eb_env):
    env = {k: v for k, v in {**os.environ, **eb_env}.items()
           if k != "EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES"}
    done = subprocess.run([sys.executable, "-m", "dsenv", "provision", "openmpi",
                           "--installpath", str(tmp_path / "inst")], capture_output=True,
                          text=True, timeout=60, env=env)
    line = one_line(done)
    if EB and openmpi_options.find_modules_tool(os.environ):
        assert "running as root, which EasyBuild refuses" in line
        assert "EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES=1" in line


def _args(**overrides):
    import argparse

    values = dict(ompi_version=None, toolchain=None, pmix=None, sourcepath=None,
                  installpath="/nonexistent/inst", robot=False, robot_paths=None,
                  env_prefix=None, eb=None, jobs=None, timeout=None, rebuild=False,
                  ompi_dry_run=False, dry_run=False)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_no_lmod_is_one_clear_error(monkeypatch, tmp_path):
    data = {**openmpi_options.table(), "lmod": {"commands": [str(tmp_path / "no-lmod")]}}
    monkeypatch.setattr(openmpi_options, "table", lambda: data)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    assert openmpi_options.find_modules_tool(env) is None
    eb = tmp_path / "eb"
    eb.write_text("#!/bin/sh\n")
    eb.chmod(0o755)
    with pytest.raises(ProvisionError, match=r"^no Lmod for EasyBuild's modules .*"
                                                     r"apt-get install lmod"):
        openmpi.make_build(_args(pmix="internal", eb=str(eb)), env=env)
    # a site that configured another modules tool is trusted
    tool = openmpi_options.find_modules_tool({**env,
                                              "EASYBUILD_MODULES_TOOL": "EnvironmentModules"})
    assert tool.tool == "EnvironmentModules" and tool.command == ""


def test_system_pmix_is_found_by_header_or_reported_missing(monkeypatch, tmp_path):
    empty_path = {"PATH": str(tmp_path / "no-bin")}  # no pkg-config
    assert find_system_pmix(empty_path, candidates=[str(tmp_path / "nothing")]) is None
    prefix = tmp_path / "pmix"
    (prefix / "include").mkdir(parents=True)
    (prefix / "include" / "pmix.h").write_text("")
    (prefix / "include" / "pmix_version.h").write_text(
        "#define PMIX_VERSION_MAJOR 4L\n#define PMIX_VERSION_MINOR 2L\n"
        "#define PMIX_VERSION_RELEASE 2L\n")
    assert find_system_pmix(empty_path, candidates=[str(tmp_path / "x"), str(prefix)]) == \
        (str(prefix), "4.2.2", "include/pmix.h found")
    data = {**openmpi_options.table()}
    data["pmix"] = {**data["pmix"], "system": {**data["pmix"]["system"],
                                               "candidates": [str(tmp_path / "nothing")]}}
    monkeypatch.setattr(openmpi_options, "table", lambda: data)
    with pytest.raises(ProvisionError, match=r"^--pmix system: no PMIx found .*"
                                                     r"apt-get install libpmix-dev"):
        openmpi.make_build(_args(), env={**empty_path, "HOME": str(tmp_path)})


# -- a failing eb -------------------------------------------------------------------------------
@needs_eb
def test_failed_eb_is_one_line_naming_the_log_and_leaves_no_build(tmp_path, eb_env):
    """A tarball with the right name but not the right bytes: eb's checksum step fails."""
    sources = tmp_path / "src"
    tiny_tarball(sources, "openmpi_4.1.4.orig.tar.xz", "openmpi-4.1.4")
    installpath = tmp_path / "inst"
    line = one_line(dsenv("provision", "openmpi", "--sourcepath", sources, "--installpath",
                          installpath, env=eb_env, timeout=300))
    log = installpath / "dsenv" / "OpenMPI-4.1.4-slurm-pmix.log"
    assert line.startswith("eb exited ") and "Checksum verification" in line
    assert line.endswith(f"full output in {log}")
    assert "== FAILED" in log.read_text() or "ERROR" in log.read_text()
    left = sorted(str(p.relative_to(installpath)) for p in installpath.rglob("*"))
    assert left == ["dsenv", "dsenv/OpenMPI-4.1.4-slurm-pmix.eb",
                    "dsenv/OpenMPI-4.1.4-slurm-pmix.log"]


@needs_eb
def test_eb_past_its_timeout_is_stopped(tmp_path, eb_env):
    sources = tmp_path / "src"
    tiny_tarball(sources, "openmpi_4.1.4.orig.tar.xz", "openmpi-4.1.4")
    installpath = tmp_path / "inst"
    began = time.monotonic()
    line = one_line(dsenv("provision", "openmpi", "--sourcepath", sources, "--installpath",
                          installpath, "--timeout", "0.005", env=eb_env))
    assert time.monotonic() - began < 30
    assert line.startswith("eb did not finish within 0.005 min (stopped; --timeout MIN)")
    assert not (installpath / "software").exists() and not (installpath / "modules").exists()


# -- the module in an environment's activate script ---------------------------------------------
def make_env(prefix: Path) -> Path:
    """A minimal environment as `dsenv provision` leaves one: activate + manifest."""
    from dsenv.envs.sites import load_site
    from dsenv.provision.record.activation import write_activation
    from dsenv.provision.record.manifest import write_manifest
    from dsenv.provision.targets import resolve_arch

    (prefix / "bin").mkdir(parents=True)
    lock = prefix / "tiny.lock"
    lock.write_text("dsenv-tiny-a==1.0\n")
    target = resolve_arch("cpu")
    write_activation(prefix, load_site("generic"), target, None, kind="prefix")
    write_manifest(prefix, kind="venv", site="generic", stack="cpu", target=target,
                   lock_file=lock, ops_mode="none", ops_requested=[], ops_installed=[],
                   versions={"python": "3"}, command=["dsenv", "provision"])
    return prefix


def fake_install(installpath: Path) -> Path:
    """An installed OpenMPI/4.1.4-slurm-pmix as eb leaves it, with Debian's real Open MPI
    programs in its bin/ and a Lua module that marks its own loading."""
    software = installpath / "software" / "OpenMPI" / "4.1.4-slurm-pmix"
    (software / "bin").mkdir(parents=True)
    for program in ("mpirun", "ompi_info"):
        (software / "bin" / program).symlink_to(shutil.which(program, path="/usr/bin"))
    module = installpath / "modules" / "all" / "OpenMPI" / "4.1.4-slurm-pmix.lua"
    module.parent.mkdir(parents=True)
    module.write_text(f'setenv("DSENV_OPENMPI_LOADED", "yes")\n'
                      f'prepend_path("PATH", "{software}/bin")\n')
    return software


@needs_eb
@pytest.mark.skipif(not DEBIAN_OMPI.is_file() or not LMOD_INIT.is_file(),
                    reason="Debian openmpi-bin and lmod needed")
def test_env_records_the_module_and_bash_loads_it(tmp_path, eb_env):
    from dsenv.provision.record.manifest import read_manifest

    prefix = make_env(tmp_path / "env")
    installpath = tmp_path / "inst"
    software = fake_install(installpath)
    sources = tmp_path / "src"
    tiny_tarball(sources, "openmpi_4.1.4.orig.tar.xz", "openmpi-4.1.4")
    for _ in range(2):  # the second run replaces the block instead of adding another
        done = dsenv("provision", "openmpi", "--sourcepath", sources, "--installpath",
                     installpath, "--env", prefix, env=eb_env)
        assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "is already installed" in out and "eb built" not in out
    assert "doctor mpi.ompi-support: ok: Open MPI 4.1.4: Slurm support (3 components) and " \
           "PMI via ext3x" in out
    assert f"    module use {installpath}/modules/all\n    module load {SYSTEM_MODULE}" in out
    assert f'modules = ["use {installpath}/modules/all", "{SYSTEM_MODULE}"]' in out

    activate = (prefix / "activate").read_text()
    assert activate.count(openmpi_record.BLOCK_BEGIN) == 1
    assert activate.count(openmpi_record.BLOCK_END) == 1
    assert "export DSENV_ENV=" in activate  # the environment's own lines are kept
    manifest = read_manifest(prefix)  # the doctor's reader still accepts the manifest
    record = manifest.extra[openmpi_record.MANIFEST_KEY]
    assert record["module"] == SYSTEM_MODULE
    assert record["modulepath"] == str(installpath / "modules" / "all")
    assert record["ompi_support"].startswith("ok: Open MPI 4.1.4")
    assert not list(prefix.glob(".*tmp*"))

    script = ('. "$1"; echo "loaded=${DSENV_OPENMPI_LOADED:-no}"; echo "mpirun=$(command -v '
              'mpirun)"; module -t list 2>&1')
    for shell_setup in (f". {LMOD_INIT}; ", ""):  # a login shell, and a bare batch shell
        shell = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", shell_setup + script, "bash",
             str(prefix / "activate")],
            capture_output=True, text=True, timeout=60,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "USER": "root"})
        assert "loaded=yes" in shell.stdout, shell.stdout + shell.stderr
        assert f"mpirun={software}/bin/mpirun" in shell.stdout
        assert SYSTEM_MODULE in shell.stdout
        assert "failed" not in shell.stderr, shell.stderr


# -- the real build (opt-in) --------------------------------------------------------------------
def debian_sources(folder: Path) -> Path:
    """`apt-get source --download-only openmpi` into ``folder``; a deb-src entry is added
    first when apt has none (a copy of debian.sources with Types: deb-src)."""
    folder.mkdir(parents=True, exist_ok=True)

    def fetch():
        return subprocess.run(["apt-get", "source", "--download-only", "openmpi"], cwd=folder,
                              capture_output=True, text=True, timeout=600)

    done = fetch()
    if done.returncode != 0 and "deb-src" in done.stderr:
        debian = Path("/etc/apt/sources.list.d/debian.sources")
        if not debian.is_file():
            pytest.skip("no deb-src entry and no /etc/apt/sources.list.d/debian.sources")
        Path("/etc/apt/sources.list.d/dsenv-deb-src.sources").write_text(
            re.sub(r"(?m)^Types: deb$", "Types: deb-src", debian.read_text()))
        subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
        done = fetch()
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.skipif(os.environ.get("DSENV_EB_REAL_BUILD") != "1",
                    reason="the real Open MPI build takes ~20 min: DSENV_EB_REAL_BUILD=1")
@needs_eb
def test_real_build_has_slurm_and_pmix_components(tmp_path, eb_env):
    """DSENV_EB_INSTALLPATH=/opt/dsenv-eb keeps the install (an existing one is judged
    without rebuilding); DSENV_EB_JOBS=N sets eb --parallel."""
    from dsenv.doctor.context import Context, Options
    from dsenv.doctor.registry import CHECKS, all_checks
    from dsenv.doctor.runner import run_check
    from dsenv.facts.mpi.installation import parse_ompi_info
    from dsenv.verdicts.findings import Status

    if shutil.which("apt-get") is None or not LMOD_INIT.is_file():
        pytest.skip("needs Debian's apt-get and lmod")
    sources = debian_sources(tmp_path / "sources")
    installpath = Path(os.environ.get("DSENV_EB_INSTALLPATH") or tmp_path / "eb")
    jobs = ["--jobs", os.environ["DSENV_EB_JOBS"]] if os.environ.get("DSENV_EB_JOBS") else []
    done = dsenv("provision", "openmpi", "--sourcepath", sources, "--installpath", installpath,
                 *jobs, env=eb_env, timeout=5000)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "doctor mpi.ompi-support: ok" in done.stdout

    # the module as a user loads it, then the doctor's parser and check on what it puts first
    shell = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c",
         f". {LMOD_INIT}; module use {installpath}/modules/all; module load {SYSTEM_MODULE}; "
         "echo PATH=$PATH; ompi_info --parsable"],
        capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, shell.stderr
    parsed = parse_ompi_info(shell.stdout)
    assert parsed.version == "4.1.4"
    assert parsed.prefix == str(installpath / "software" / SYSTEM_MODULE)
    assert parsed.slurm_components == ["ess:slurm", "plm:slurm", "ras:slurm"]
    assert "ext3x" in parsed.pmix_clients
    path = next(line[5:] for line in shell.stdout.splitlines() if line.startswith("PATH="))
    all_checks()
    result = run_check(CHECKS["mpi.ompi-support"],
                       Context(options=Options(target="compute", launcher="srun"),
                               env={**os.environ, "PATH": path}))
    assert result.status is Status.OK, result
    assert "ext3x" in result.summary


@needs_eb
def test_two_runs_sharing_an_install_path_take_turns(tmp_path, eb_env):
    """Issue 13: two `dsenv provision openmpi` runs on one install path at once: the second
    waits for the first (one eb at a time, one log at a time), both end in their one line,
    and the install path is left as one failed run leaves it. Two --dry-run runs write
    nothing and never wait."""
    sources = tmp_path / "src"
    tiny_tarball(sources, "openmpi_4.1.4.orig.tar.xz", "openmpi-4.1.4")
    installpath = tmp_path / "inst"
    dry = [subprocess.Popen([sys.executable, "-m", "dsenv", "provision", "openmpi",
                             "--sourcepath", str(sources), "--installpath", str(installpath),
                             "--dry-run"], env={**os.environ, **eb_env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
    for child in dry:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0 and "waiting for" not in out, err
    assert not installpath.exists()
    runs = [subprocess.Popen([sys.executable, "-m", "dsenv", "provision", "openmpi",
                              "--sourcepath", str(sources), "--installpath", str(installpath)],
                             env={**os.environ, **eb_env}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(child.communicate(timeout=300), child.returncode) for child in runs]
    for (_, err), code in results:
        assert code == 2 and "Traceback" not in err, err
        assert err.strip().startswith("dsenv provision openmpi: eb exited "), err
    assert any("waiting for " in out for (out, _), _ in results)
    log = (installpath / "dsenv" / "OpenMPI-4.1.4-slurm-pmix.log").read_text()
    assert log.count("# dsenv provision openmpi") == 1  # one run's log, whole
    left = sorted(str(p.relative_to(installpath)) for p in installpath.rglob("*"))
    assert left == ["dsenv", "dsenv/OpenMPI-4.1.4-slurm-pmix.eb",
                    "dsenv/OpenMPI-4.1.4-slurm-pmix.log"]
