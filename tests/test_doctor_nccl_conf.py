"""The comm and launch checks judge the value NCCL will use, from the environment or NCCL's
configuration files (NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf), and name the file.

Real files in the test's home and root trees, real /sys trees written from recorded outputs
(tests/fixtures/comm), and for the launch checks a survey of this machine's own interfaces
through an ssh that runs the host probe here.
"""

import ast
import os
from pathlib import Path

import pytest

from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_check
from dsenv.facts.comm.ncclconf import nccl_setting, nccl_settings, parse_conf
from dsenv.verdicts.findings import Status
from tests.harness.doctor_cli import tool
from tests.harness.findings import here
from tests.harness.recorded import fixture_text
from tests.harness.sysfs import (
    gids_to_sysfs,
    ibdev2netdev_to_sysfs,
    ibstat_to_sysfs,
    ibv_devinfo_gids,
)

REPO = Path(__file__).resolve().parent.parent


def h100(root):
    """CX-7 InfiniBand HCAs (down) and CX-6 Ethernet ports (two up) of an H100 node."""
    return ibdev2netdev_to_sysfs(fixture_text("comm/ibdev2netdev-h100.txt"), root)


def roce(root):
    """A ConnectX-7 RoCE port with the GID table of NVIDIA/nccl#769 (index 3 is RoCE v2)."""
    ibstat_to_sysfs(fixture_text("comm/ibstat-connectx7-roce.txt"), root)
    gids_to_sysfs(ibv_devinfo_gids(fixture_text("comm/ibv_devinfo-gids-roce.txt")), root,
                  "mlx5_0")
    return root


# check, node, variable, a value that breaks it and the verdict, a healthy value and its verdict
CASES = [
    ("comm.socket-ifname", h100, "NCCL_SOCKET_IFNAME", "ib9", Status.FAIL, "ibp", Status.OK),
    ("comm.ib-hca", h100, "NCCL_IB_HCA", "=mlx5_12", Status.FAIL, "mlx5_0:1,mlx5_7",
     Status.OK),
    ("comm.ib-disable", h100, "NCCL_IB_DISABLE", "1", Status.WARN, "0", Status.SKIP),
    ("comm.roce-gid", roce, "NCCL_IB_GID_INDEX", "0", Status.WARN, "3", Status.OK),
]
IDS = [case[0] for case in CASES]


@pytest.fixture
def node(tmp_path, make_ctx, run_one):
    """``node(check, build, env=..., files={place: text})`` -> the check's result. Places:
    "home" (~/.nccl.conf), "etc" (/etc/nccl.conf under the root), "conf" (the file
    NCCL_CONF_FILE names, which the fixture then sets)."""
    home, root = tmp_path / "home", tmp_path / "root"
    places = {"home": home / ".nccl.conf", "etc": root / "etc/nccl.conf",
              "conf": tmp_path / "site" / "nccl.conf"}

    built = []

    def run(check, build, env=None, files=None):
        if build not in built:
            build(root)
            built.append(build)
        base = {"PATH": "/usr/bin", "HOME": str(home)}
        for place, text in (files or {}).items():
            places[place].parent.mkdir(parents=True, exist_ok=True)
            places[place].write_text(text)
            if place == "conf":
                base["NCCL_CONF_FILE"] = str(places["conf"])
        return run_one(check, make_ctx(env={**base, **(env or {})}, root=root,
                                       target="compute"))

    run.places = places
    return run


@pytest.mark.parametrize("check, build, variable, bad, bad_status, good, good_status", CASES,
                         ids=IDS)
@pytest.mark.parametrize("place", ["etc", "home", "conf"])
def test_a_value_from_a_file_gets_the_environments_verdict_and_names_the_file(
        node, check, build, variable, bad, bad_status, good, good_status, place):
    path = node.places[place]
    for value, status in ((bad, bad_status), (good, good_status)):
        from_env = node(check, build, env={variable: value})
        from_file = node(check, build, files={place: f"# site settings\n{variable}={value}\n"})
        assert from_env.status is status, from_env
        assert from_file.status is status, from_file
        assert f"{variable}={value} (from {path})" in from_file.summary, from_file
        assert from_file.summary.replace(f" (from {path})", "") == from_env.summary
        assert any(str(path) in e for e in from_file.evidence), from_file
        assert "(from" not in from_env.summary
        for place_ in node.places.values():  # the next round starts without files
            place_.unlink(missing_ok=True)


@pytest.mark.parametrize("check, build, variable, bad, bad_status, good, good_status", CASES,
                         ids=IDS)
def test_the_environment_wins_over_the_files(node, check, build, variable, bad, bad_status,
                                            good, good_status):
    files = {"etc": f"{variable}={bad}\n", "home": f"{variable}={bad}\n"}
    result = node(check, build, env={variable: good}, files=files)
    assert result.status is good_status and "(from" not in result.summary, result
    files = {"etc": f"{variable}={good}\n", "home": f"{variable}={good}\n"}
    result = node(check, build, env={variable: bad}, files=files)
    assert result.status is bad_status and "(from" not in result.summary, result


@pytest.mark.parametrize("check, build, variable, bad, bad_status, good, good_status", CASES,
                         ids=IDS)
def test_the_users_file_wins_over_etc(node, check, build, variable, bad, bad_status, good,
                                     good_status):
    result = node(check, build, files={"home": f"{variable}={bad}\n", "etc": f"{variable}={good}\n"})
    assert result.status is bad_status and str(node.places["home"]) in result.summary, result
    # NCCL_CONF_FILE replaces ~/.nccl.conf: the home file is not read at all
    result = node(check, build, files={"conf": f"{variable}={good}\n"})
    assert result.status is good_status and str(node.places["conf"]) in result.summary, result


@pytest.mark.parametrize("check, build, variable, bad, bad_status, good, good_status", CASES,
                         ids=IDS)
def test_no_file_and_no_variable_is_unchanged(node, check, build, variable, bad, bad_status,
                                              good, good_status):
    result = node(check, build)
    if check == "comm.roce-gid":  # unset is itself the finding there: NCCL may pick a bad GID
        assert result.status is Status.WARN and here(result) == "export NCCL_IB_GID_INDEX=3"
    else:
        assert result.status is Status.SKIP and f"{variable} is not set" in result.summary
    looked = next(e for e in result.evidence if e.startswith("looked in"))
    assert str(node.places["home"]) in looked and str(node.places["etc"]) in looked


def test_the_fix_for_a_files_value_says_where_it_is(node):
    result = node("comm.ib-disable", h100, files={"home": "NCCL_IB_DISABLE=1\n"})
    conf = node.places["home"]
    assert here(result).startswith(f"export NCCL_IB_DISABLE=0 (it overrides the line in {conf})")
    assert result.action.variables == (("NCCL_IB_DISABLE", "0"),)  # --fix exports the override
    result = node("comm.socket-ifname", h100, files={"etc": "NCCL_SOCKET_IFNAME=ib9\n"})
    etc = node.places["etc"]
    assert f"delete its line from {etc}" in here(result)
    assert not result.action.applicable and str(etc) in result.action.why_not
    result = node("comm.roce-gid", roce, files={"etc": "NCCL_IB_GID_INDEX=0\n"})
    assert here(result) == f"export NCCL_IB_GID_INDEX=3 (it overrides the line in {etc})"


def test_ib_disabled_by_a_file_on_a_node_without_active_ports_is_fine(node):
    down = lambda root: ibstat_to_sysfs(fixture_text("comm/ibstat-ib-down.txt"), root)  # noqa: E731
    result = node("comm.ib-disable", down, files={"home": "NCCL_IB_DISABLE=1\n"})
    assert result.status is Status.OK and str(node.places["home"]) in result.summary


def test_a_net_plugin_named_in_etc_nccl_conf_is_looked_for(node, tmp_path):
    def slingshot(root):
        for name in ("cxi0", "cxi1"):
            (root / "sys/class/cxi" / name).mkdir(parents=True, exist_ok=True)

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "libnccl-net-ofi.so").write_bytes(b"")  # only the named plugin exists
    env = {"LD_LIBRARY_PATH": str(plugins)}
    assert node("comm.slingshot", slingshot, env=env).status is Status.FAIL
    result = node("comm.slingshot", slingshot, env=env, files={"etc": "NCCL_NET_PLUGIN=ofi\n"})
    assert result.status is Status.OK and "libnccl-net-ofi.so" in result.summary, result


# -- how NCCL reads its files (src/misc/param.cc setEnvFile) -----------------------------------


def test_lines_are_read_as_nccl_reads_them(make_ctx, tmp_path):
    assert parse_conf("NCCL_A = 1\n  NCCL_B=2\nbroken line\n#NCCL_C=3\nNCCL_D=4\nNCCL_D=5\n=6\n") \
        == {"NCCL_A ": " 1", "  NCCL_B": "2", "NCCL_D": "4"}
    etc = tmp_path / "root" / "etc" / "nccl.conf"
    etc.parent.mkdir(parents=True)
    etc.write_text("NCCL_SOCKET_IFNAME = ib0\nNCCL_IB_HCA=mlx5_0 \n")
    ctx = make_ctx(env={"HOME": str(tmp_path / "home")})
    assert nccl_setting(ctx, "NCCL_SOCKET_IFNAME") is None  # NCCL sets "NCCL_SOCKET_IFNAME "
    assert nccl_setting(ctx, "NCCL_IB_HCA").value == "mlx5_0"


def test_an_empty_variable_hides_the_files_line(make_ctx, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_SOCKET_IFNAME=ib9\n")
    ctx = make_ctx(env={"HOME": str(home), "NCCL_SOCKET_IFNAME": ""})
    assert nccl_settings(ctx)["NCCL_SOCKET_IFNAME"].source == "environment"
    assert nccl_setting(ctx, "NCCL_SOCKET_IFNAME") is None  # setenv(..., 0): NCCL's default
    ctx = make_ctx(env={"HOME": str(home), "NCCL_CONF_FILE": ""})  # empty: ~/.nccl.conf read
    assert nccl_setting(ctx, "NCCL_SOCKET_IFNAME").source == str(home / ".nccl.conf")


# -- launch.hosts-ifname: the survey's hosts are this machine, reached by an ssh that runs here --


@pytest.fixture
def two_hosts(tmp_path, make_ctx, run_one):
    bin_dir = tool(tmp_path / "bin", "ssh", 'while [ "$1" = "-o" ]; do shift 2; done\n'
                   'shift\nexec sh -c "$1"\n')
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("nid01 slots=1\nnid02 slots=1\n")
    home, root = tmp_path / "home", tmp_path / "root"
    etc = root / "etc" / "nccl.conf"
    etc.parent.mkdir(parents=True)
    home.mkdir()

    def run(etc_text=None, **env):
        if etc_text is not None:
            etc.write_text(etc_text)
        full = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home),
                "DSENV_HOSTFILE": str(hostfile), **env}
        ctx = make_ctx(env=full, root=root, target="compute", nodes=2, launcher="deepspeed")
        return run_one("launch.hosts-ifname", ctx)

    run.etc = etc
    return run


def test_hosts_ifname_judges_the_value_from_etc_nccl_conf(two_hosts):
    result = two_hosts("NCCL_SOCKET_IFNAME=ib9\n")
    assert result.status is Status.FAIL, result
    assert f"NCCL_SOCKET_IFNAME=ib9 (from {two_hosts.etc}): no interface ib9" in result.summary
    assert "nid01" in result.summary and "nid02" in result.summary
    # the environment wins over the file; the healthy twin names the file
    assert two_hosts(NCCL_SOCKET_IFNAME="lo").status is Status.OK
    result = two_hosts("NCCL_SOCKET_IFNAME=lo\n")
    assert result.status is Status.OK and str(two_hosts.etc) in result.summary, result
    assert result.summary.endswith("valid on all 2 hosts")
    result = two_hosts("")
    assert result.status is Status.SKIP and "not set" in result.summary
    assert any(str(two_hosts.etc) in e for e in result.evidence)


# -- the class: no check reads an NCCL variable from the environment itself ----------------------


def _env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """NCCL_* names read straight from an ``env`` mapping: env.get("NCCL_X"), env["NCCL_X"],
    "NCCL_X" in env (ctx.env, node.env, os.environ alike)."""
    def is_env(node):
        return (isinstance(node, ast.Attribute) and node.attr in ("env", "environ")) or \
            (isinstance(node, ast.Name) and node.id in ("env", "environ"))

    def nccl(node):
        return isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and node.value.startswith("NCCL_")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop", "setdefault") and is_env(node.func.value) \
                and node.args and nccl(node.args[0]):
            found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Subscript) and is_env(node.value) and nccl(node.slice):
            found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Compare) and nccl(node.left) \
                and any(is_env(c) for c in node.comparators):
            found.append((node.lineno, node.left.value))
    return found


def test_no_check_reads_an_nccl_variable_from_the_environment():
    folders = [REPO / "doctor" / "checks", REPO / "dsenv" / "facts" / "comm",
               REPO / "dsenv" / "facts" / "launch"]
    breaches = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if path.name == "ncclconf.py":  # the one reader
                continue
            for line, name in _env_reads(ast.parse(path.read_text())):
                breaches.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not breaches, "read NCCL variables with ncclconf.nccl_setting:\n" + "\n".join(breaches)
    sample = ast.parse('a = ctx.env.get("NCCL_X", "")\nb = node.env["NCCL_Y"]\n'
                       'c = "NCCL_Z" in os.environ\nd = ctx.env.get("MASTER_ADDR")\n')
    assert [n for _, n in _env_reads(sample)] == ["NCCL_X", "NCCL_Y", "NCCL_Z"]


class Watched(dict):
    """An environment that notes every NCCL_* name looked up in it by key."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = []

    def _note(self, key):
        if isinstance(key, str) and key.startswith("NCCL_") and key != "NCCL_CONF_FILE":
            self.asked.append(key)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def test_no_comm_or_launch_check_looks_an_nccl_variable_up_by_name(tmp_path, make_ctx):
    """What the scan cannot see (a name held in a variable): every comm and launch check,
    run with NCCL variables set, never asks the environment for one by name."""
    all_checks()
    root = h100(tmp_path / "root")
    bin_dir = tool(tmp_path / "bin", "ssh", 'while [ "$1" = "-o" ]; do shift 2; done\n'
                   'shift\nexec sh -c "$1"\n')
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("nid01 slots=1\nnid02 slots=1\n")
    env = Watched({"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home"),
                   "DSENV_HOSTFILE": str(hostfile), "MASTER_ADDR": "127.0.0.1",
                   "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "mlx5_0",
                   "NCCL_IB_DISABLE": "1", "NCCL_IB_GID_INDEX": "3", "NCCL_NET_PLUGIN": "ofi"})
    ctx = make_ctx(env=env, root=root, target="compute", nodes=2, launcher="deepspeed",
                   probe_timeout=5)
    checks = [c for c in CHECKS.values() if c.area in ("comm", "launch")]
    assert {"comm.socket-ifname", "launch.hosts-ifname"} <= {c.id for c in checks}
    results = [run_check(c, ctx) for c in checks]
    assert not [r for r in results if r.status is Status.ERROR], results
    assert env.asked == [], f"looked up by name: {sorted(set(env.asked))}"
