"""`dsenv explain --here` runs the named cause's doctor check on this node now (issue 23):
the cause present here, its healthy twin, a check that does not apply here, and a cause no
check can see before the job. The node is real: PATH and the environment are what change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from dsenv.doctor import catalogue
from dsenv.doctor.context import Context, Options
from dsenv.doctor.explain import here
from dsenv.doctor.explain.command import explain_text
from tests.harness.cli import dsenv, explain

NINJA = "RuntimeError: Ninja is required to load C++ extensions"
HERE = "\n  here    "


def _here(done) -> str:
    assert done.returncode == 0, explain(done)
    assert HERE in done.stdout, done.stdout
    return " ".join(done.stdout.split(HERE, 1)[1].split("\n  source")[0].split())


def test_the_cause_is_present_here(tmp_path):
    # the environment has ninja in its bin folder, the job's PATH does not reach it
    done = dsenv("explain", "--here", "--env", sys.executable, NINJA,
                 env={"PATH": str(tmp_path)})
    text = _here(done)
    assert "toolkit.ninja finds: FAIL" in text and "the cause is present here" in text
    # the catalogue's fix, the one `dsenv explain` prints, then this node's command
    assert f"fix here: {' '.join(catalogue.fix_for('jit.ninja-missing').split())}" in text
    assert f"here: export PATH={os.path.dirname(sys.executable)}:$PATH" in text


def test_healthy_twin_is_not_found_here(tmp_path):
    done = dsenv("explain", "--here", "--env", sys.executable, NINJA,
                 env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"})
    text = _here(done)
    assert "toolkit.ninja finds: OK" in text and "not found here" in text
    assert "fix here" not in text


def test_a_check_that_does_not_apply_here_says_so(tmp_path):
    venv = tmp_path / "bare"  # an environment without torch: nothing is JIT-built
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    done = dsenv("explain", "--here", "--env", str(venv), NINJA, env={"PATH": str(tmp_path)})
    text = _here(done)
    assert "toolkit.ninja finds: SKIP torch is not installed" in text
    assert "cannot confirm or rule it out" in text


def test_a_cause_no_check_can_see_says_why():
    done = dsenv("explain", "--here", "what():  [FT][ERROR] CUDA runtime error: "
                 "CUBLAS_STATUS_ARCH_MISMATCH /workspace/open_attention.h:171")
    assert _here(done).startswith("no doctor check can see this before the job")


def test_json_carries_what_the_check_found(tmp_path):
    done = dsenv("explain", "--here", "--json", "--env", sys.executable, NINJA,
                 env={"PATH": str(tmp_path)})
    first = json.loads(done.stdout)["matches"][0]
    assert first["id"] == "jit.ninja-missing" and first["check"] == "toolkit.ninja"
    assert any(x.startswith("on this node toolkit.ninja finds: FAIL") for x in first["here"])


def test_without_here_it_offers_the_live_check():
    done = dsenv("explain", NINJA)
    assert "`dsenv explain --here` runs it on this node now" in done.stdout
    assert HERE not in done.stdout


def test_here_costs_less_than_the_doctor(tmp_path):
    """The live check runs one check, not the doctor's sixty: it must not take longer."""
    def wall(*args) -> float:
        start = time.monotonic()
        dsenv(*args, env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"})
        return time.monotonic() - start
    # interleaved, so that both see the same load on a busy machine; the best of five each
    pairs = [(wall("explain", "--here", "--env", sys.executable, NINJA),
              wall("doctor", "--env", sys.executable)) for _ in range(5)]
    here, doctor = min(p[0] for p in pairs), min(p[1] for p in pairs)
    assert here < doctor, pairs


def test_a_group_is_decided_by_the_check_both_members_share(tmp_path):
    # "libcuda.so.1: cannot open shared object file" is a container started without the GPUs
    # or a node without the driver (group driver-lib-not-found); gpu.devices tells them apart
    # on a compute target that expects GPUs: inside Docker it names the container.
    _, _, sure, _ = explain_text("OSError: libcuda.so.1: cannot open shared object file: No "
                                 "such file or directory")
    members = [m for m in sure if m.shared]
    assert [m.id for m in members] == ["container.no-gpu-runtime", "gpu.no-gpu-on-node"]
    docker, bare = tmp_path / "docker", tmp_path / "bare"
    docker.mkdir()
    bare.mkdir()
    (docker / ".dockerenv").touch()
    env = {"PATH": str(tmp_path / "no-tools"), "HOME": str(tmp_path),
           "SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "4"}
    said = {}
    for name, root in (("docker", docker), ("bare", bare)):
        ctx = Context(options=Options(target="compute"), env=env, root=root)
        results = {}
        found = {id(m): here.look(m, ctx, results) for m in members}
        said[name] = here.which_here(members, found)
    assert said["docker"] == "of these causes, this node shows container.no-gpu-runtime"
    assert said["bare"] == "of these causes, this node shows gpu.no-gpu-on-node"
