"""envs/sites: the shipped profiles load, agree with the stacks and archs, and say what their
public sources did; broken profiles are refused."""

from __future__ import annotations

import pytest

from dsenv.envs import sites
from dsenv.envs.sites import load_site, site_names
from dsenv.envs.stacks import get_stack
from dsenv.errors import DsenvError
from dsenv.provision.targets import choose_stack, resolve_arch


def test_shipped_sites():
    assert {"lumi", "daint", "hpc5", "generic"} <= set(site_names())
    for name in site_names():
        site = load_site(name)
        assert site.name == name and site.default_kind in sites.KINDS


def test_default_is_generic_plain_venv():
    site = load_site()
    assert site.name == "generic" and site.default_kind == "venv"
    assert not site.modules and not site.env and site.container is None and not site.hf_home


def test_unknown_site_lists_the_names():
    with pytest.raises(DsenvError) as error:
        load_site("jureca")
    assert "unknown site; known sites: daint, generic, hpc5, lumi" in str(error.value)


def test_lumi_rocm_singularity_slingshot():
    site = load_site("lumi")
    assert (site.vendor, site.default_kind, site.default_arch) == ("amd", "container", "gfx90a")
    assert get_stack(site.default_stack).vendor == "amd"
    assert choose_stack(resolve_arch(site.default_arch)).name == site.default_stack
    assert site.container.runtime == "singularity" and "$SCRATCH:/scratch" in site.container.binds
    assert site.module_commands() == [["swap", "PrgEnv-cray", "PrgEnv-gnu"]]  # LUMI's BERT example
    assert site.env["NCCL_SOCKET_IFNAME"] == "hsn"
    assert {"FI_CXI_DISABLE_CQ_HUGETLB", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR",
            "CXI_FORK_SAFE"} <= set(site.env)
    assert site.launcher == "mpirun" and site.offline_on_compute


def test_daint_sarus_host_openmpi():
    site = load_site("daint")
    assert (site.vendor, site.default_kind, site.default_stack) == ("nvidia", "container",
                                                                    "cuda12.6")
    assert choose_stack(resolve_arch(site.default_arch)).name == "cuda12.6"  # P100
    assert site.container.runtime == "sarus"
    assert site.container.image == "nvcr.io/nvidia/pytorch:22.08-py3"  # CSCS's example
    assert site.modules == ("daint-gpu", "sarus", "OpenMPI/4.1.2")  # its job script
    assert site.launcher == "mpirun" and site.srun_mpi == "pmi2"
    assert site.env["NCCL_SOCKET_IFNAME"] == "ipogif0" and site.env["NCCL_IB_DISABLE"] == "1"


def test_hpc5_conda_cuda_module():
    site = load_site("hpc5")
    assert (site.default_kind, site.default_arch, site.default_stack) == ("conda", "7.0",
                                                                          "cuda12.6")
    assert site.module_commands() == [["load", "cuda/12.6"]]  # the HPC5 guide's cuda/<version>
    assert site.hf_home.startswith("/s/ls4/") and site.env_root.startswith("/s/ls4/")
    with pytest.raises(DsenvError):  # its K80 nodes: no torch 2.13 stack
        choose_stack(resolve_arch("K80"))


def raw_site(**changes):
    raw = {"name": "x", "default_kind": "venv", "vendor": "nvidia", "default_arch": "8.0",
           "default_stack": "cuda13.0", "env": {"NCCL_SOCKET_IFNAME": "ib0"}}
    raw.update(changes)
    return raw


def test_site_problems_are_found():
    assert sites._problems("x", raw_site()) == []
    assert any("credential" in p for p in sites._problems("x", raw_site(env={"HF_TOKEN": "t"})))
    assert any("not a variable name" in p
               for p in sites._problems("x", raw_site(env={"A-B": "1"})))
    assert any("rocm7.2 is built for amd" in p
               for p in sites._problems("x", raw_site(default_stack="rocm7.2")))
    assert any("default_arch gfx90a is amd" in p
               for p in sites._problems("x", raw_site(default_arch="gfx90a",
                                                      default_stack="")))
    assert any("no [container] table" in p
               for p in sites._problems("x", raw_site(default_kind="container")))
    assert any("file is y.toml" in p for p in sites._problems("y", raw_site()))
    assert any("default_kind" in p for p in sites._problems("x", raw_site(default_kind="pixi")))
