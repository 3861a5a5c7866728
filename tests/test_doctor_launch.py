"""launch area: MASTER_ADDR, MASTER_PORT and DeepSpeed's pdsh runner, broken for real and
healthy, mostly through `python -m dsenv doctor --only launch --json`.

Loopback only: a real listener on 127.0.0.1 holds MASTER_PORT; names resolve from an
/etc/hosts bind-mounted in a private mount namespace (unshare -m, root), never from DNS;
pdsh and ssh are fake tools printing recorded outputs.
"""

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.facts.comm import netaddr
from dsenv.facts.launch import dsrunner, joblayout
from dsenv.facts.python.pyfiles import read_assignments
from dsenv.net import free_port
from dsenv.verdicts.findings import Status
from tests.harness.doctor_cli import clean_env, doctor, printing, tool
from tests.harness.findings import here
from tests.harness.recorded import fixture_text

TWO_NODES = ("--target", "compute", "--nodes", "2")


def launch(*args, env, cwd=None):
    return doctor("--only", "launch", *args, env=env, cwd=cwd)


# -- parsers and DeepSpeed's own rules ----------------------------------------------------------


def test_slurm_hostlists_expand_as_scontrol_does():
    assert joblayout.expand_hostlist("nid[0007-0009,0012],gpu1") == [
        "nid0007", "nid0008", "nid0009", "nid0012", "gpu1"]
    assert joblayout.expand_hostlist("rack[1-2]-n[01-02]") == [
        "rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    assert joblayout.short_name("gpu07.cluster.org") == "gpu07"
    assert joblayout.short_name("10.1.2.3") == "10.1.2.3"


def test_a_site_interface_name_still_names_the_node():
    from dsenv.doctor.checks.job.launch import names_allocated_host

    assert names_allocated_host("nid01-ib", ["nid01", "nid02"])
    assert names_allocated_host("nid02.cluster.org", ["nid01", "nid02"])
    assert not names_allocated_host("nid010", ["nid01"])


def test_hostfile_parser_follows_deepspeeds_runner():
    hosts, error = dsrunner.parse_hostfile("# two nodes\nnid01 slots=4\n\nnid02  slots=2\n")
    assert hosts == {"nid01": 4, "nid02": 2} and error is None
    assert "bad entry: nid01 4" in dsrunner.parse_hostfile("nid01 4\n")[1]
    assert "multiple entries for nid01" in dsrunner.parse_hostfile("nid01 slots=1\nnid01 slots=1\n")[1]
    assert "empty" in dsrunner.parse_hostfile("# nothing\n")[1]


def test_copied_constants_match_the_installed_deepspeed():
    """The copies used when no DeepSpeed is found are the installed runner's own."""
    spec = importlib.util.find_spec("deepspeed")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DeepSpeed is not installed here")
    runner = Path(list(spec.submodule_search_locations)[0]) / "launcher" / "runner.py"
    values = read_assignments(runner)
    assert tuple(values["EXPORT_ENVS"]) == dsrunner.EXPORT_ENVS
    assert values["DLTS_HOSTFILE"] == dsrunner.DEFAULT_HOSTFILE
    text = runner.read_text()
    assert dsrunner.HOSTFILE_LINE.pattern in text and '"DS_ENV_FILE", ".deepspeed_env"' in text
    cuda = runner.parent.parent / "accelerator" / "cuda_accelerator.py"
    assert dsrunner.export_envs_of(cuda) == dsrunner.ACCELERATOR_EXPORTS["cuda"]


def test_proc_net_tcp_shows_a_real_listener_and_its_owner(make_ctx):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        ctx = make_ctx(root="/")
        found = netaddr.listeners(ctx, port)
        assert [(f.address, f.port) for f in found] == [("127.0.0.1", port)]
        owners = netaddr.socket_owners(ctx, {f.inode for f in found})
        assert os.getpid() in [o.pid for o in owners]
    assert netaddr.bind_error("127.0.0.1", port) is None  # closed: free again


def test_rcmd_module_lists():
    from dsenv.doctor.checks.job.launch import parse_rcmd_modules

    assert parse_rcmd_modules(fixture_text("launch/pdsh_V_2.34_epel.txt")) == ["ssh", "exec"]
    assert parse_rcmd_modules(fixture_text("launch/pdsh_usage_rsh_exec.txt")) == ["rsh", "exec"]


# -- launch.master-addr ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["localhost", "127.0.0.1", "::1"])
def test_loopback_master_addr_on_two_nodes_fails(tmp_path, value):
    result = launch(*TWO_NODES, env=clean_env(MASTER_ADDR=value))["launch.master-addr"]
    assert result["status"] == "fail" and "loopback" in result["summary"], result


def test_slurm_node_count_counts_too_and_one_node_may_use_loopback(tmp_path):
    result = launch("--target", "compute", env=clean_env(MASTER_ADDR="localhost",
                                                        SLURM_NNODES="2"))["launch.master-addr"]
    assert result["status"] == "fail" and "SLURM_NNODES=2" in result["summary"]
    one = launch("--target", "compute", env=clean_env(MASTER_ADDR="localhost"))
    assert one["launch.master-addr"]["status"] == "skip"


def test_a_multi_host_hostfile_counts_as_several_nodes(tmp_path):
    root = hostfile_root(tmp_path)
    result = launch("--target", "compute", "--root", root,
                    env=clean_env(MASTER_ADDR="127.0.0.1"))["launch.master-addr"]
    assert result["status"] == "fail" and "lists 2 hosts" in result["summary"], result


def test_an_address_other_nodes_can_reach_is_ok(tmp_path):
    result = launch(*TWO_NODES, env=clean_env(MASTER_ADDR="192.0.2.10"))["launch.master-addr"]
    assert result["status"] == "ok" and "192.0.2.10" in result["summary"], result


def test_unset_master_addr_warns_for_srun_and_deepspeed_finds_its_own(make_ctx, run_one):
    ctx = make_ctx(env={}, target="compute", nodes=2, launcher="srun")
    assert run_one("launch.master-addr", ctx).status is Status.WARN
    ctx = make_ctx(env={}, target="compute", nodes=2, launcher="deepspeed")
    assert run_one("launch.master-addr", ctx).status is Status.INFO


HOSTS_SCRIPT = """set -e
mount --bind "$HOSTS" /etc/hosts
mount --bind "$NSSWITCH" /etc/nsswitch.conf
exec "$PY" -m dsenv doctor --json --only launch --target compute --nodes 2
"""


def in_namespace(tmp_path, master_addr, **extra):
    """The CLI in a private mount namespace whose /etc/hosts we wrote (files only, no DNS)."""
    hosts, nsswitch = tmp_path / "hosts", tmp_path / "nsswitch.conf"
    hosts.write_text("127.0.0.1 localhost\n127.0.1.1 node-a\n192.0.2.10 node-b\n")
    nsswitch.write_text("hosts: files\n")
    env = clean_env(HOSTS=str(hosts), NSSWITCH=str(nsswitch), PY=sys.executable,
                    MASTER_ADDR=master_addr, **extra)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", HOSTS_SCRIPT],
                          capture_output=True, text=True, env=env, timeout=120)
    if done.returncode not in (0, 1) or not done.stdout.startswith("{"):
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()[-200:]}")
    return {r["id"]: r for r in json.loads(done.stdout)["results"]}["launch.master-addr"]


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="bind-mounting /etc/hosts needs root (unshare -m)")


@needs_root
def test_a_hostname_mapped_to_127_0_1_1_fails(tmp_path):
    result = in_namespace(tmp_path, "node-a")
    assert result["status"] == "fail" and "127.0.1.1" in result["summary"], result


@needs_root
def test_a_name_that_does_not_resolve_fails_and_a_real_one_passes(tmp_path):
    result = in_namespace(tmp_path, "nosuch-node")
    assert result["status"] == "fail" and "does not resolve" in result["summary"], result
    result = in_namespace(tmp_path, "node-b")
    assert result["status"] == "ok" and "192.0.2.10" in result["summary"], result


@needs_root
def test_a_master_outside_the_allocation_warns(tmp_path):
    result = in_namespace(tmp_path, "node-b", SLURM_JOB_NODELIST="nid[01-02]")
    assert result["status"] == "warn" and "not one of the allocated nodes" in result["summary"]
    result = in_namespace(tmp_path, "node-b", SLURM_JOB_NODELIST="nid[01-02],node-b")
    assert result["status"] == "ok", result


# -- launch.port ----------------------------------------------------------------------------------


def test_a_port_held_by_a_listener_fails_and_names_it(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = launch("--target", "compute", env=clean_env(MASTER_PORT=str(port)))["launch.port"]
        in_job = launch("--target", "compute", env=clean_env(MASTER_PORT=str(port),
                                                            SLURM_JOB_ID="4242"))["launch.port"]
    assert result["status"] == "fail" and "already in use" in result["summary"], result
    assert f"held by pid {os.getpid()}" in result["summary"]
    suggested = int(re.match(r"export MASTER_PORT=(\d+) ", here(result)).group(1))
    assert suggested != port and netaddr.bind_error("127.0.0.1", suggested) is None
    assert in_job["status"] == "fail" and "SLURM_JOB_ID % 50000" in in_job["fix"]


def test_a_free_port_is_ok_and_a_word_is_no_port(tmp_path):
    port = free_port()
    result = launch("--target", "compute", env=clean_env(MASTER_PORT=str(port)))["launch.port"]
    assert result["status"] == "ok" and str(port) in result["summary"], result
    bad = launch("--target", "compute", env=clean_env(MASTER_PORT="auto"))["launch.port"]
    assert bad["status"] == "fail" and "not a TCP port" in bad["summary"]


def _bind_errno_as_nobody(port: int) -> int:
    """The errno of a real bind of 127.0.0.1:port by uid 65534 (0: bound), in a forked child."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 255
        try:
            os.setuid(65534)
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
            code = 0
        except OSError as exc:
            code = exc.errno if exc.errno and exc.errno < 250 else 250
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_privileged_port_refused_to_a_user_names_the_mode():
    from dsenv.doctor.checks.job.launch import refused_port
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to uid 65534 for a real non-root bind")
    start = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
    if not start.exists() or int(start.read_text()) <= 98:
        pytest.skip("this kernel lets any user bind port 98")
    code = _bind_errno_as_nobody(98)
    assert code == 13, code  # EACCES, from the kernel
    error = OSError(code, os.strerror(code))
    found = refused_port(98, "127.0.0.1", error, ["MASTER_PORT=98"], "export MASTER_PORT=29500")
    assert found.status is Status.FAIL and found.mode == "launch.privileged-port", found
    assert "below 1024" in found.summary and "29500" in str(found.evidence)
    # the healthy twin: the same user binds a high port
    assert _bind_errno_as_nobody(free_port()) == 0
    # a refusal on a high port (a security module, a sandbox) is not the privileged-port rule
    other = refused_port(40000, "127.0.0.1", error, [], "export MASTER_PORT=29500")
    assert other.status is Status.FAIL and other.mode != "launch.privileged-port"


def test_port_of_another_host_or_on_a_login_node_is_not_checked_here(make_ctx, run_one):
    ctx = make_ctx(env={"MASTER_ADDR": "192.0.2.10"}, target="compute")
    result = run_one("launch.port", ctx)
    assert result.status is Status.SKIP and "another host" in result.summary
    assert run_one("launch.port", make_ctx(env={}, target="login")).status is Status.SKIP


# -- launch.pdsh ----------------------------------------------------------------------------------


def pdsh_tools(tmp_path, pdsh_fixture=None, ssh_ok=True):
    """A bin folder with a recorded pdsh (if any) and an ssh that logs its arguments."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    if pdsh_fixture:
        tool(folder, "pdsh", printing(tmp_path / "data", pdsh_fixture) + "\n")
    log = tmp_path / "ssh-args"
    # `ssh -V` answers as OpenSSH does (its version on stderr) whatever the keys
    tool(folder, "ssh", '[ "$1" = -V ] && { echo "OpenSSH_9.2p1, OpenSSL 3.0.19" >&2; exit 0; }\n'
         f'echo "$@" >> {log}\n' + (
        "exit 0\n" if ssh_ok else 'echo "Permission denied (publickey)." >&2\nexit 255\n'))
    return folder, log


def hostfile_root(tmp_path, text="nid01 slots=4\nnid02 slots=4\n"):
    root = tmp_path / "root"
    (root / "job").mkdir(parents=True, exist_ok=True)
    (root / "job" / "hostfile").write_text(text)
    return root


def test_no_pdsh_fails_for_the_deepspeed_launcher_on_two_nodes(make_ctx, run_one, tmp_path):
    folder, _ = pdsh_tools(tmp_path)
    ctx = make_ctx(env={"PATH": str(folder)}, target="compute", nodes=2, launcher="deepspeed")
    result = run_one("launch.pdsh", ctx)
    assert result.status is Status.FAIL and "pdsh is not on PATH" in result.summary
    assert "--launcher slurm" in result.fix
    srun = make_ctx(env={"PATH": str(folder)}, target="compute", nodes=2, launcher="srun")
    assert run_one("launch.pdsh", srun).status is Status.SKIP


def test_pdsh_without_its_ssh_module_fails(make_ctx, run_one, tmp_path):
    folder, _ = pdsh_tools(tmp_path, "launch/pdsh_usage_rsh_exec.txt")
    ctx = make_ctx(env={"PATH": str(folder)}, target="compute", nodes=2, launcher="deepspeed")
    result = run_one("launch.pdsh", ctx)
    assert result.status is Status.FAIL and "no ssh rcmd module" in result.summary


def test_ssh_that_asks_for_a_password_fails_and_passwordless_ssh_passes(tmp_path):
    folder, log = pdsh_tools(tmp_path, "launch/pdsh_V_2.34_epel.txt", ssh_ok=False)
    root = hostfile_root(tmp_path)
    env = clean_env(PATH=f"{folder}:{os.environ['PATH']}")
    args = (*TWO_NODES, "--launcher", "deepspeed", "--root", root)
    result = launch(*args, env=env)["launch.pdsh"]
    assert result["status"] == "fail" and "no passwordless ssh to nid01" in result["summary"]
    assert "BatchMode=yes" in log.read_text() and "nid01 true" in log.read_text()
    pdsh_tools(tmp_path, "launch/pdsh_V_2.34_epel.txt", ssh_ok=True)
    result = launch(*args, env=env)["launch.pdsh"]
    assert result["status"] == "ok" and "ssh reaches nid01" in result["summary"], result


def stub_libcrypto(folder: Path) -> Path:
    """A libcrypto.so.3 that is not the system's (a real shared library, built here, without
    OpenSSL's symbols): what a conda env's or a module's lib/ on LD_LIBRARY_PATH hands ssh."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "stub.c"
    source.write_text("int dsenv_not_openssl(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", folder / "libcrypto.so.3", source,
                    "-Wl,-soname,libcrypto.so.3"], check=True, timeout=60)
    return folder


needs_ssh_and_gcc = pytest.mark.skipif(
    not (shutil.which("ssh") and shutil.which("gcc")),
    reason="needs OpenSSH's ssh and gcc (.ci/run installs openssh-client and build-essential)")


@needs_ssh_and_gcc
def test_ssh_that_cannot_start_on_a_foreign_libcrypto_fails_and_names_the_folder(
        make_ctx, run_one, tmp_path):
    folder, _ = pdsh_tools(tmp_path, "launch/pdsh_V_2.34_epel.txt")
    (folder / "ssh").unlink()  # the system's own ssh
    ssh_dir = os.path.dirname(shutil.which("ssh"))
    env = {"PATH": f"{folder}:{ssh_dir}",
           "LD_LIBRARY_PATH": str(stub_libcrypto(tmp_path / "env" / "lib"))}
    result = run_one("launch.pdsh", make_ctx(env=env, target="compute", nodes=2,
                                             launcher="deepspeed"))
    assert result.status is Status.FAIL, result
    assert result.mode == "loader.foreign-openssl-shadows-system"
    assert "ssh cannot start in the job's environment" in result.summary
    assert any("symbol lookup error" in e for e in result.evidence), result.evidence
    assert f"libcrypto on LD_LIBRARY_PATH: {tmp_path / 'env' / 'lib'}" in result.evidence
    assert any(e.startswith("here: take ") for e in result.evidence)
    # its healthy twin: the same ssh without that folder starts (no other host to try)
    del env["LD_LIBRARY_PATH"]
    result = run_one("launch.pdsh", make_ctx(env=env, target="compute", nodes=2,
                                             launcher="deepspeed"))
    assert result.status is Status.OK, result
    assert any(e.startswith("ssh -V: ['OpenSSH_") for e in result.evidence), result.evidence


def test_ssh_refusals_name_their_mode():
    from dsenv.doctor.checks.job.launch import ssh_failure_mode
    # the words users posted (modin-project/unidist#314, conda/conda#10241)
    assert ssh_failure_mode("OpenSSL version mismatch. Built against 30000020, you have "
                            "30100010") == "launch.ssh-openssl-mismatch"
    assert ssh_failure_mode("ssh: symbol lookup error: ssh: undefined symbol: EVP_KDF_ctrl, "
                            "version OPENSSL_1_1_1b") == "loader.foreign-openssl-shadows-system"
    assert ssh_failure_mode("Permission denied (publickey).") is None
    assert ssh_failure_mode("ssh: symbol lookup error: ssh: undefined symbol: "
                            "gss_acquire_cred") is None  # not OpenSSL's


# -- launch.ds-hostfile ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected, words", [
    (None, "fail", "Unable to find hostfile"),
    ("nid01 4\n", "fail", "bad entry"),
    ("nid01 slots=4\n", "fail", "1 host(s) for 2 nodes"),
    ("nid01 slots=2\nnid02 slots=2\n", "fail", "fewer slots than the 4 ranks"),
    ("nid01 slots=4\nnid03 slots=4\n", "fail", "outside this allocation: nid03"),
    ("# from the allocation\nnid01 slots=4\nnid02 slots=4\n", "ok", "2 host(s)"),
])
def test_hostfile_as_deepspeeds_runner_reads_it(tmp_path, text, expected, words):
    root = hostfile_root(tmp_path, text) if text is not None else tmp_path / "root"
    env = clean_env(SLURM_JOB_NODELIST="nid[01-02]")
    result = launch(*TWO_NODES, "--launcher", "deepspeed", "--gpus-per-node", "4", "--root", root,
                    env=env)["launch.ds-hostfile"]
    assert result["status"] == expected and words in result["summary"], result


def test_hostfile_from_dsenv_hostfile_and_a_stale_one_on_one_node(make_ctx, run_one, tmp_path):
    own = tmp_path / "out" / "hostfile"
    own.parent.mkdir()
    own.write_text("nid01 slots=4\nnid02 slots=4\n")
    ctx = make_ctx(env={"DSENV_HOSTFILE": str(own)}, target="compute", nodes=2,
                   launcher="deepspeed")
    result = run_one("launch.ds-hostfile", ctx)
    assert result.status is Status.OK and str(own) in result.summary
    ctx = make_ctx(env={"DSENV_HOSTFILE": str(own)}, target="compute", nodes=1,
                   launcher="deepspeed")
    result = run_one("launch.ds-hostfile", ctx)
    assert result.status is Status.WARN and "--num_nodes 1" in result.fix


# -- launch.ds-env --------------------------------------------------------------------------------------


def ds_env_case(tmp_path, **variables):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = clean_env(HOME=str(home), **variables)
    return home, work, env


def ds_env(tmp_path, env, work):
    return launch(*TWO_NODES, "--launcher", "deepspeed", env=env, cwd=work)["launch.ds-env"]


def test_variables_pdsh_drops_warn_and_the_fix_makes_them_reach(tmp_path):
    home, work, env = ds_env_case(tmp_path, HF_HOME="/scratch/hf", TORCH_EXTENSIONS_DIR="/scratch/ext",
                                  NCCL_SOCKET_IFNAME="ib0", PYTHONPATH="/src")
    result = ds_env(tmp_path, env, work)
    assert result["status"] == "warn", result
    assert "HF_HOME, TORCH_EXTENSIONS_DIR" in result["summary"]
    assert "NCCL_SOCKET_IFNAME" not in result["summary"] and "PYTHONPATH" not in result["summary"]
    # apply the fix as a user would, in the launch folder, and check again
    subprocess.run(["bash", "-c", here(result).removesuffix(" in the launch folder")], cwd=work,
                   env=env, check=True, timeout=30)
    assert (work / ".deepspeed_env").read_text() == \
        "HF_HOME=/scratch/hf\nTORCH_EXTENSIONS_DIR=/scratch/ext\n"
    assert ds_env(tmp_path, env, work)["status"] == "ok"


def test_home_and_launch_folder_files_both_count(tmp_path):
    home, work, env = ds_env_case(tmp_path, HF_HOME="/scratch/hf", TORCH_EXTENSIONS_DIR="/x")
    (home / ".deepspeed_env").write_text("HF_HOME=/scratch/hf\n")
    (work / ".deepspeed_env").write_text("TORCH_EXTENSIONS_DIR=/x\n")
    result = ds_env(tmp_path, env, work)
    assert result["status"] == "ok", result


def test_a_blank_line_in_deepspeed_env_fails(tmp_path):
    home, work, env = ds_env_case(tmp_path, HF_HOME="/scratch/hf")
    (home / ".deepspeed_env").write_text("HF_HOME=/scratch/hf\n\n")
    result = ds_env(tmp_path, env, work)
    assert result["status"] == "fail" and "line(s) 2" in result["summary"], result


def test_a_stale_value_in_deepspeed_env_warns(tmp_path):
    home, work, env = ds_env_case(tmp_path, HF_HOME="/scratch/new")
    (home / ".deepspeed_env").write_text("HF_HOME=/scratch/old\n")
    result = ds_env(tmp_path, env, work)
    assert result["status"] == "warn" and "another value" in result["summary"], result


def test_an_activated_environments_path_is_needed_and_ds_env_file_renames(tmp_path):
    venv = tmp_path / "venv"
    home, work, env = ds_env_case(tmp_path, VIRTUAL_ENV=str(venv),
                                  PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    result = ds_env(tmp_path, env, work)
    assert result["status"] == "warn" and re.search(r"\bPATH\b", result["summary"]), result
    (work / "site_env").write_text(f"PATH={env['PATH']}\n")
    assert ds_env(tmp_path, {**env, "DS_ENV_FILE": "site_env"}, work)["status"] == "ok"


def test_one_node_or_another_launcher_skips(make_ctx, run_one):
    assert run_one("launch.ds-env", make_ctx(env={}, nodes=1, launcher="deepspeed")).status \
        is Status.SKIP
    assert run_one("launch.ds-env", make_ctx(env={}, nodes=2, launcher="torchrun")).status \
        is Status.SKIP
