"""`dsenv lock`: uv pip compile with hashes, byte-stable, atomic; reading locks back."""

from __future__ import annotations

import hashlib

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.locks import (
    LOCKS_DIR,
    REQUIREMENTS_DIR,
    compile_lock,
    lock_path,
    lock_sha256,
    locked_requirement,
    parse_lock,
    read_lock,
    requirements_path,
)
from dsenv.provision.uvcmd import Sources
from tests.harness.tinywheels import offline, wheel_hash


def test_compile_lock_pins_every_package_with_its_hash(tiny_lock, tiny_wheels):
    text = tiny_lock.read_text()
    assert parse_lock(text) == {"dsenv-tiny-a": "1.0", "dsenv-tiny-b": "1.0"}
    entries = {e.name: e for e in read_lock(text)}
    assert entries["dsenv-tiny-a"].hashes == (wheel_hash(tiny_wheels, "dsenv-tiny-a"),)
    assert entries["dsenv-tiny-b"].hashes == (wheel_hash(tiny_wheels, "dsenv-tiny-b"),)
    header = text.splitlines()[:4]
    assert header[0].startswith("# Locked by dsenv (uv ")
    assert header[1] == "# Regenerate: dsenv lock --stack tiny"
    assert header[2].startswith("# Input: tiny.in; Python 3.11")
    assert header[3] == f"# Sources: no index; find-links {tiny_wheels}"
    assert "# via dsenv-tiny-b" in text and "# via -r tiny.in" in text
    assert str(tiny_lock.parent) not in text.split("# Sources")[0]  # no temp paths


def test_compile_lock_is_byte_stable_and_leaves_no_temporary_files(tiny_lock, tiny_wheels,
                                                                   tmp_path):
    again = compile_lock(["dsenv-tiny-b==1.0"], tmp_path / "tiny.txt",
                         sources=offline(tiny_wheels), regenerate="dsenv lock --stack tiny")
    assert again.read_bytes() == tiny_lock.read_bytes()
    # Again over the existing file (uv prefers its pins): still the same bytes.
    compile_lock(["dsenv-tiny-b==1.0"], again, sources=offline(tiny_wheels),
                 regenerate="dsenv lock --stack tiny")
    assert again.read_bytes() == tiny_lock.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.txt"]


def test_compile_lock_from_an_in_file_names_it_by_file_name(tiny_wheels, tmp_path):
    reqs = tmp_path / "reqs" / "mystack.in"
    reqs.parent.mkdir()
    reqs.write_text("# comment\ndsenv-tiny-a==1.0\n")
    out = compile_lock(reqs, tmp_path / "locks" / "mystack.txt", sources=offline(tiny_wheels),
                       python_platform="x86_64-manylinux_2_28")
    text = out.read_text()
    assert "# via -r mystack.in" in text and str(tmp_path / "reqs") not in text
    assert "platform x86_64-manylinux_2_28" in text


def test_unreachable_index_is_one_line_naming_the_index_and_where_to_run(
        tmp_path, no_retries):
    out = tmp_path / "cuda12.6.txt"
    out.write_text("# the previous lock\n")
    with pytest.raises(ProvisionError) as err:
        compile_lock(["torch==2.13.0"], out,
                     sources=Sources.of(index_url="http://127.0.0.1:9/simple"),
                     regenerate="dsenv lock --stack cuda12.6", timeout=60)
    message = str(err.value)
    assert "\n" not in message
    assert "cannot reach the package index http://127.0.0.1:9/simple" in message
    assert "Connection refused" in message
    assert "run `dsenv lock --stack cuda12.6` on a machine that reaches it" in message
    assert out.read_text() == "# the previous lock\n"  # untouched on failure
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuda12.6.txt"]


def test_unsatisfiable_requirements_are_one_line(tiny_wheels, tmp_path):
    with pytest.raises(ProvisionError) as err:
        compile_lock(["dsenv-tiny-a==9.9"], tmp_path / "x.txt", sources=offline(tiny_wheels))
    assert "\n" not in str(err.value) and "dsenv-tiny-a" in str(err.value)
    with pytest.raises(ProvisionError, match="does not exist"):
        compile_lock(tmp_path / "missing.in", tmp_path / "x.txt")


def test_parse_lock_normalizes_names_and_joins_continuation_lines():
    text = (
        "# header\n"
        "Foo_Bar.baz==1.0 \\\n"
        "    --hash=sha256:aa \\\n"
        "    --hash=sha256:bb\n"
        "    # via -r x.in\n"
        "--index-url https://example.org/simple\n"
        "torch==2.13.0+cpu ; sys_platform == 'linux' \\\n"
        "    --hash=sha256:cc\n"
        "rich[jupyter]===15.0.0\n"
    )
    assert parse_lock(text) == {"foo-bar-baz": "1.0", "torch": "2.13.0+cpu", "rich": "15.0.0"}
    foo, torch, _rich = read_lock(text)
    assert foo.hashes == ("sha256:aa", "sha256:bb")
    assert foo.line() == "Foo_Bar.baz==1.0 --hash=sha256:aa --hash=sha256:bb"
    assert torch.requirement.startswith("torch==2.13.0+cpu ;")
    with pytest.raises(ProvisionError, match=r"x.txt line 2: 'numpy>=2' is not pinned"):
        read_lock("a==1\nnumpy>=2\n", "x.txt")


def test_lock_sha256_is_the_files_sha256(tmp_path):
    path = tmp_path / "lock.txt"
    path.write_bytes(b"a==1\n" * 1000)
    assert lock_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- committed locks
def _pins(stack):
    return {name: version for name, version in parse_lock(
        "\n".join(line for line in requirements_path(stack).read_text().splitlines()
                  if line and not line.startswith("#"))).items()}


def test_committed_cpu_lock_matches_its_inputs_and_says_how_to_regenerate():
    assert requirements_path("cpu").parent == REQUIREMENTS_DIR
    assert lock_path("cpu").parent == LOCKS_DIR
    text = lock_path("cpu").read_text()
    locked = parse_lock(text)
    for name, version in _pins("cpu").items():
        assert locked[name] == version, name
    assert locked["torch"] == "2.13.0+cpu"
    assert not any(name.startswith("nvidia-") for name in locked)
    assert all(entry.hashes for entry in read_lock(text))
    assert "# Regenerate: dsenv lock --stack cpu --find-links /opt/wheels" in text
    assert "platform x86_64-manylinux_2_28" in text
    assert locked_requirement(lock_path("cpu"), "DeepSpeed").line().startswith(
        "deepspeed==0.19.8 --hash=sha256:")


def test_committed_cuda13_lock_is_pypis_cuda_13_0_torch():
    text = lock_path("cuda13.0").read_text()
    locked = parse_lock(text)
    for name, version in _pins("cuda13.0").items():
        assert locked[name] == version, name
    assert locked["torch"] == "2.13.0"  # PyPI's default Linux wheel: a CUDA build
    assert locked["cuda-toolkit"].startswith("13.0.")
    assert locked["nvidia-cuda-runtime"].startswith("13.0.")
    assert "nvidia-nccl-cu13" in locked and "triton" in locked
    assert "# Regenerate: dsenv lock --stack cuda13.0" in text
    assert all(entry.hashes for entry in read_lock(text))


@pytest.mark.parametrize("stack", ["cpu", "cuda12.8", "cuda13.0"])
def test_every_committed_lock_carries_what_the_ops_build_imports(stack):
    """The ops build installs DeepSpeed's sdist without build isolation: its setup.py imports
    setuptools (and ninja drives the compile) from the env. torch 2.10 (cuda12.8) does not
    pull setuptools in: without the pin the Volta build failed at once ("No module named
    'setuptools'")."""
    locked = parse_lock(lock_path(stack).read_text())
    assert "setuptools" in _pins(stack) and "setuptools" in locked
    assert "ninja" in locked


def test_constraints_are_applied_and_recorded_by_file_name(tiny_wheels, tmp_path):
    reqs = tmp_path / "in" / "c.in"
    reqs.parent.mkdir()
    reqs.write_text("dsenv-tiny-b\n")
    cons = tmp_path / "constraints" / "site.txt"
    cons.parent.mkdir()
    cons.write_text("dsenv-tiny-a==1.0\n")
    out = compile_lock(reqs, tmp_path / "c.txt", sources=offline(tiny_wheels),
                       constraints=[cons])
    text = out.read_text()
    assert "# Constraints: site.txt" in text and str(tmp_path) not in text.split("# Sources")[0]
    assert parse_lock(text) == {"dsenv-tiny-a": "1.0", "dsenv-tiny-b": "1.0"}
    cons.write_text("dsenv-tiny-a<1.0\n")
    with pytest.raises(ProvisionError, match="dsenv-tiny-a"):
        compile_lock(reqs, tmp_path / "c.txt", sources=offline(tiny_wheels),
                     constraints=[cons])
