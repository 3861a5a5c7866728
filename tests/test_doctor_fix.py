"""`dsenv doctor --fix`: each fix tested by breaking the node for real, fixing it with the real
command, and judging it again (for the activate-script fixes: in a shell that sources the
script, as a job does). Nothing is mocked: real files, a real /proc, real child processes.

The environments are minimal `dsenv provision` prefixes (activate script written by
provision/record/activation.py, manifest), made without the Hugging Face offline block; the real
provisioned venv is tests/provision/test_doctor_fix_env.py's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from dsenv.doctor import catalogue
from dsenv.doctor.context import Context, Options
from dsenv.doctor.fix import actions as fa
from dsenv.doctor.fix import fixers as fixes
from dsenv.doctor.fix.command import run_fixes
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_check
from dsenv.verdicts.findings import FixAction, Status
from tests.harness.cli import dsenv, sourced

SCHEMA = json.loads((Path(catalogue.__file__).parent / "report_schema.json").read_text())
CLOSED = "http://127.0.0.1:9"  # nothing listens: the hub is unreachable, as on a compute node
BEGIN = "# >>> dsenv doctor --fix activate-offline-vars >>>"


def make_env(prefix: Path) -> Path:
    """A `dsenv provision` prefix whose activate script lacks the offline variables (written
    with compute_offline=False, as for a site whose compute nodes have internet)."""
    from dsenv.envs.sites import load_site
    from dsenv.provision.record.activation import write_activation
    from dsenv.provision.targets import resolve_arch

    (prefix / "bin").mkdir(parents=True)
    write_activation(prefix, load_site("generic"), resolve_arch("cpu"), None,
                     compute_offline=False, kind="prefix")
    assert "HF_HUB_OFFLINE" not in (prefix / "activate").read_text()
    return prefix


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A job's environment inside Slurm job 4242, without any *_OFFLINE variable."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "USER": "tester",
           "SLURM_JOB_ID": "4242", "HF_ENDPOINT": CLOSED, "NO_COLOR": "1",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env.update(extra)
    return env


def doctor(*args, env, sourcing: Path | None = None, stdin=subprocess.DEVNULL,
           timeout=240) -> subprocess.CompletedProcess:
    """`python -m dsenv doctor ARGS` with exactly ``env``; ``sourcing``: inside a shell that
    sourced that activate script first, as a job script does."""
    return dsenv("doctor", *args, base=env, wrapper=sourced(sourcing) if sourcing else (),
                 stdin=stdin, timeout=timeout)


def result_of(done: subprocess.CompletedProcess, check_id: str) -> dict:
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA)
    return next(r for r in report["results"] if r["id"] == check_id)


def tree_state(folder: Path) -> dict[str, str]:
    """Every file's hash and every folder's mode under ``folder``."""
    state = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_file():
            state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            state[rel] = oct(path.stat().st_mode)
    return state


def stale_lock(ext: Path, op: str = "fused_adam", age: float = 7200) -> Path:
    """A lock left by a killed build: no process has it open, ``age`` seconds old."""
    (ext / op).mkdir(parents=True)
    lock = ext / op / "lock"
    lock.write_text("")
    old = time.time() - age
    os.utime(lock, (old, old))
    return lock


# -- activate-offline-vars -------------------------------------------------------------------


def test_offline_vars_written_then_the_sourced_env_passes(tmp_path):
    prefix = make_env(tmp_path / "env")
    script = prefix / "activate"
    original = script.read_text()
    env = base_env(tmp_path)
    broken = doctor("--only", "cache", "--json", env=env, sourcing=script)
    offline = result_of(broken, "cache.offline")
    assert offline["status"] == "fail" and broken.returncode == 1
    assert offline["action"]["kind"] == "activate-offline-vars"
    assert offline["action"]["applicable"] is True
    assert offline["action"]["target"] == str(script)

    done = doctor("--only", "cache", "--fix", "--yes", env=env, sourcing=script)
    assert "✓ cache.offline: fixed" in done.stdout, done.stdout
    assert done.returncode == 0, done.stdout
    text = script.read_text()
    assert text.count(BEGIN) == 1 and 'if [ -n "${SLURM_JOB_ID:-}" ]' in text
    assert (prefix / "activate.dsenv-fix.bak").read_text() == original

    again = doctor("--only", "cache", "--json", env=env, sourcing=script)
    assert result_of(again, "cache.offline")["status"] == "ok", again.stdout
    assert again.returncode == 0
    # outside a Slurm job the block changes nothing: the login node may still download
    login = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}
    shown = subprocess.run(["sh", "-c", '. "$0" && echo "[${HF_HUB_OFFLINE:-}]"', str(script)],
                           env=login, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"


def test_offline_block_is_replaced_not_appended_and_removable(tmp_path):
    prefix = make_env(tmp_path / "env")
    script = prefix / "activate"
    original = script.read_text()
    action = FixAction(fa.OFFLINE, "offline", str(script), True,
                       variables=(("HF_HUB_OFFLINE", "1"),), guard="slurm")
    ctx = Context(env=base_env(tmp_path), root=Path("/"))
    fixes.apply(action, ctx, "cache.offline")
    fixes.apply(action, ctx, "cache.offline")
    text = script.read_text()
    assert text.count(BEGIN) == 1
    assert fixes.block_pattern(fa.OFFLINE).sub("\n", text).rstrip("\n") == original.rstrip("\n")
    assert os.stat(script).st_mode & 0o777 == 0o644


def test_script_not_written_by_dsenv_is_left_alone(tmp_path):
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "activate").write_text("# my own activate script\nexport A=1\n")
    before = tree_state(prefix)
    env = base_env(tmp_path, DSENV_ENV=str(prefix))
    done = doctor("--only", "cache", "--json", env=env)
    action = result_of(done, "cache.offline")["action"]
    assert action["applicable"] is False and "not written by `dsenv provision`" in \
        action["why_not"]
    fixed = doctor("--only", "cache", "--fix", "--yes", env=env)
    assert "By hand" in fixed.stdout and "export HF_HUB_OFFLINE=1" in fixed.stdout
    assert tree_state(prefix) == before


# -- remove-stale-lock -----------------------------------------------------------------------


def test_stale_lock_is_removed(tmp_path):
    ext = tmp_path / "ext"
    lock = stale_lock(ext)
    env = base_env(tmp_path, TORCH_EXTENSIONS_DIR=str(ext))
    done = doctor("--only", "deepspeed", "--skip", "deepspeed.ops,deepspeed.accelerator",
                  "--fix", "--yes", env=env)
    assert "✓ deepspeed.extension-locks: fixed" in done.stdout, done.stdout
    assert not lock.exists() and (ext / "fused_adam").is_dir()


def test_lock_held_by_a_live_process_is_not_removed(tmp_path):
    ext = tmp_path / "ext"
    lock = stale_lock(ext)
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                               "print('holding', flush=True)\ntime.sleep(120)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        env = base_env(tmp_path, TORCH_EXTENSIONS_DIR=str(ext))
        done = doctor("--only", "deepspeed", "--skip", "deepspeed.ops,deepspeed.accelerator",
                      "--fix", "--yes", env=env)
        assert "deepspeed.extension-locks: fixed" not in done.stdout
        assert lock.exists()
        # the fixer looks again right before removing: a build that took the lock after the
        # check ran keeps it
        action = fa.remove_locks([lock])
        with pytest.raises(fixes.FixError, match=f"pid {holder.pid}"):
            fixes.apply(action, Context(env=env, root=Path("/")), "deepspeed.extension-locks")
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait()


# -- activate-extensions-dir -----------------------------------------------------------------


def test_unwritable_extensions_dir_repointed_from_the_activate_script(tmp_path):
    prefix = make_env(tmp_path / "env")
    # /proc refuses new files even for root: a real write failure
    env = base_env(tmp_path, TORCH_EXTENSIONS_DIR="/proc/dsenv-test/torch_extensions")
    ctx = Context(options=Options(target="compute"), env=env, root=Path("/"),
                  python_prefix=prefix)
    all_checks()
    before = run_check(CHECKS["deepspeed.extensions-dir"], ctx)
    assert before.status == Status.FAIL, before
    assert before.action.kind == "activate-extensions-dir" and before.action.applicable
    out = io.StringIO()
    after, records = run_fixes([before], ctx, yes=True, dry_run=False, out=out)
    assert records[0].fixed, out.getvalue()
    assert after[0].status == Status.OK
    assert "export TORCH_EXTENSIONS_DIR=" in (prefix / "activate").read_text()


# -- activate-cache-vars -----------------------------------------------------------------------


def test_unwritable_miopen_db_moved_to_node_local_disk(tmp_path):
    prefix = make_env(tmp_path / "env")
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "dev" / "kfd").write_text("")  # a ROCm node
    env = base_env(tmp_path, MIOPEN_USER_DB_PATH="/proc/dsenv-test/miopen")
    ctx = Context(options=Options(target="compute"), env=env, root=root, python_prefix=prefix)
    all_checks()
    before = run_check(CHECKS["cache.miopen-db"], ctx)
    assert before.status == Status.FAIL, before
    assert before.action.kind == "activate-cache-vars" and before.action.applicable
    out = io.StringIO()
    after, records = run_fixes([before], ctx, yes=True, dry_run=False, out=out)
    assert records[0].fixed and after[0].status == Status.OK, out.getvalue()
    text = (prefix / "activate").read_text()
    assert 'export MIOPEN_USER_DB_PATH="/tmp/$USER/miopen"' in text


# -- create-cache-dir ------------------------------------------------------------------------


@pytest.mark.parametrize("where, mode", [("home", 0o700), ("project", 0o755)])
def test_missing_hf_cache_is_created_with_its_mode(tmp_path, where, mode):
    env = base_env(tmp_path, HF_HUB_OFFLINE="1")
    if where == "project":
        (tmp_path / "project").mkdir()
        env["HF_HOME"] = str(tmp_path / "project" / "hf")
    hub = Path(env.get("HF_HOME", Path(env["HOME"]) / ".cache" / "huggingface")) / "hub"
    assert not hub.exists()
    before = doctor("--only", "cache", "--json", env=env)
    action = result_of(before, "cache.hf-dirs")["action"]
    assert action["kind"] == "create-cache-dir" and action["mode"] == f"{mode:04o}"
    done = doctor("--only", "cache", "--fix", "--yes", env=env)
    assert "✓ cache.hf-dirs: fixed" in done.stdout, done.stdout
    for folder in (hub, hub.parent / "datasets", hub.parent):
        assert folder.is_dir() and folder.stat().st_mode & 0o777 == mode, folder
    after = doctor("--only", "cache", "--json", env=env)
    assert result_of(after, "cache.hf-dirs")["status"] == "ok"


# -- activate-nccl-vars -------------------------------------------------------------------------


def active_ib_root(root: Path) -> Path:
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    for name, value in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"),
                        ("link_layer", "InfiniBand"), ("rate", "200 Gb/sec (4X HDR)")):
        (port / name).write_text(value + "\n")
    for net in ("lo", "ib0", "eth0"):
        (root / "sys/class/net" / net).mkdir(parents=True)
    return root


@pytest.mark.parametrize("variables, check_id, written", [
    ({"NCCL_IB_DISABLE": "1"}, "comm.ib-disable", "export NCCL_IB_DISABLE=\"0\""),
    ({"NCCL_SOCKET_IFNAME": "hsn"}, "comm.socket-ifname", "unset NCCL_SOCKET_IFNAME"),
    ({"NCCL_NET": "Socket"}, "comm.nccl-env", "unset NCCL_NET"),
])
def test_nccl_variables_reset_in_the_activate_script(tmp_path, variables, check_id, written):
    prefix = make_env(tmp_path / "env")
    root = active_ib_root(tmp_path / "root")
    all_checks()
    ctx = Context(options=Options(target="compute"), env=base_env(tmp_path, **variables),
                  root=root, python_prefix=prefix)
    before = run_check(CHECKS[check_id], ctx)
    assert before.status in (Status.WARN, Status.FAIL), before
    assert before.action is not None and before.action.kind == "activate-nccl-vars"
    out = io.StringIO()
    after, records = run_fixes([before], ctx, yes=True, dry_run=False, out=out)
    assert records[0].fixed, out.getvalue()
    assert after[0].status in (Status.OK, Status.SKIP, Status.INFO)
    assert written in (prefix / "activate").read_text()


def test_nccl_setting_from_a_config_file_is_left_to_the_user(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_NET=Socket\n")
    ctx = Context(options=Options(target="compute"), env=base_env(tmp_path), python_prefix=
                  make_env(tmp_path / "env"), root=active_ib_root(tmp_path / "root"))
    all_checks()
    result = run_check(CHECKS["comm.nccl-env"], ctx)
    assert result.status == Status.WARN and not result.action.applicable
    assert "delete the line" in result.action.why_not


# -- what --fix may do, and when ----------------------------------------------------------------


def broken_node(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Offline variables missing, a stale lock in the extensions folder the activate script
    exports (PREFIX/torch_extensions), the HF caches missing: three fixes due."""
    prefix = make_env(tmp_path / "env")
    stale_lock(prefix / "torch_extensions")
    return base_env(tmp_path), prefix / "activate"


ONLY = ("--only", "cache,deepspeed", "--skip", "deepspeed.ops,deepspeed.accelerator")


def test_dry_run_only_shows(tmp_path):
    env, script = broken_node(tmp_path)
    before = tree_state(tmp_path)
    done = doctor(*ONLY, "--fix", "--dry-run", "--yes", env=env, sourcing=script)
    assert "dry run: nothing changed (3 change(s) shown)" in done.stdout, done.stdout
    for check_id in ("cache.offline", "cache.hf-dirs", "deepspeed.extension-locks"):
        assert f"  {check_id}" in done.stdout
    assert tree_state(tmp_path) == before


def test_without_terminal_and_without_yes_nothing_changes(tmp_path):
    env, script = broken_node(tmp_path)
    before = tree_state(tmp_path)
    done = doctor(*ONLY, "--fix", env=env, sourcing=script)
    assert "no terminal to ask and no --yes: nothing changed" in done.stdout, done.stdout
    assert done.returncode == 1
    assert tree_state(tmp_path) == before


def test_terminal_answers_decide(tmp_path):
    env, script = broken_node(tmp_path)
    leader, follower = pty.openpty()
    try:  # answers in the order of the report: the lock, cache.hf-dirs, cache.offline
        os.write(leader, b"n\nn\ny\n")
        done = doctor(*ONLY, "--fix", env=env, sourcing=script, stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.stdout.count("[y/N]") == 3, done.stdout
    assert "- cache.hf-dirs: left as it is" in done.stdout
    assert "✓ cache.offline: fixed" in done.stdout
    assert BEGIN in script.read_text()
    assert (tmp_path / "env" / "torch_extensions" / "fused_adam" / "lock").exists()
    assert not (tmp_path / "home" / ".cache" / "huggingface").exists()


def test_json_carries_each_fix_and_what_it_did(tmp_path):
    env, script = broken_node(tmp_path)
    done = doctor(*ONLY, "--json", env=env, sourcing=script)
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA)
    actions = {r["id"]: r["action"] for r in report["results"] if r.get("action")}
    assert actions["cache.offline"]["variables"] == {
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    assert actions["cache.offline"]["guard"] == "slurm"
    assert actions["deepspeed.extension-locks"]["command"].startswith("rm ")
    assert actions["cache.hf-dirs"]["command"].startswith("mkdir -p -m 0700 ")
    assert all(a["applicable"] for a in actions.values())

    fixed = doctor(*ONLY, "--json", "--fix", "--yes", env=env, sourcing=script)
    report = json.loads(fixed.stdout)
    jsonschema.validate(report, SCHEMA)
    assert {r["check"]: r["fixed"] for r in report["fixes"]} == {
        "cache.offline": True, "cache.hf-dirs": True, "deepspeed.extension-locks": True}
    assert "Fixes (dsenv doctor --fix)" in fixed.stderr  # the screen of --fix, off stdout
    after = {r["id"]: r["status"] for r in report["results"]}  # the re-checked verdicts
    assert [after[i] for i in ("cache.offline", "cache.hf-dirs", "deepspeed.extension-locks")] \
        == ["ok", "ok", "ok"]
    assert after["deepspeed.install"] == "fail"  # no DeepSpeed in it: by hand, not by --fix


def test_fix_options_need_fix(tmp_path):
    for flag in ("--yes", "--dry-run"):
        done = doctor(flag, env=base_env(tmp_path))
        assert done.returncode == 2
        assert done.stderr.strip() == f"dsenv doctor: {flag} goes with --fix: " \
                                      f"`dsenv doctor --fix {flag}`"


# -- the catalogue and the fixers name the same kinds -------------------------------------------


def test_catalogue_fixable_names_the_fixers():
    named = {m.fixable for m in catalogue.modes() if m.fixable}
    assert named <= set(fa.KINDS), named - set(fa.KINDS)
    assert set(fa.KINDS) == set(fixes.FIXERS)
    # every fixer answers a catalogue entry, but for a missing cache folder (cache.hf-dirs),
    # which fails no job by itself
    assert set(fa.KINDS) - named == {fa.CREATE_DIR}
    schema_kinds = SCHEMA["properties"]["results"]["items"]["properties"]["action"][
        "properties"]["kind"]["enum"]
    assert set(schema_kinds) == set(fa.KINDS)
    all_checks()
    for mode in catalogue.modes():
        if mode.fixable:
            assert mode.check in CHECKS, mode.id


def test_list_shows_catalogue_ids(tmp_path):
    done = doctor("--list", env=base_env(tmp_path))
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["check", "title", "catalogue"]
    offline = next(line for line in lines if line.startswith("cache.offline "))
    assert "cache.hf-online-on-offline-node" in offline.split(None, 1)[1]
    locks = next(line for line in lines if line.startswith("deepspeed.extension-locks "))
    assert "jit.stale-extension-lock" in locks
