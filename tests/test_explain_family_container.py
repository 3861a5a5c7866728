"""The container family parser (doctor/explain/families/container.py) on the real texts of
tests/fixtures/explain_symptoms/container.jsonl: each is read into its parts and the mode its
thread established; texts of other families and empty text give no reading."""

from __future__ import annotations

import pytest

from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import container
from tests.harness import symptoms

ROWS = symptoms.rows("container")
# Modes the catalogue's own patterns name (no structure to read beyond the words).
BY_PATTERN = {"container.ldcache-missing-driver-libs",
              # text-embeddings-inference's own refusal: both numbers are in its one wording
              "container.tei-image-for-other-gpu", "container.tei-no-image-for-gpu",
              "container.tei-release-lacks-arch",
              # Apptainer's image-format and action-script words, and EROFS on the image's own folders
              "container.image-file-not-an-image", "container.apptainer-image-has-no-sh",
              "container.image-read-only",
              # Docker Desktop's placeholder for docker in a WSL distro: one wording, its WSL version
              "container.wsl-docker-desktop-integration-inactive",
              # the Kubernetes API server's refusal of a Kubeflow job kind or its CRD's version
              "container.k8s-kubeflow-job-crd-version",
              # NGC's registry answering 401 in docker's, BuildKit's and enroot's words; enroot's
              # mkdir of an admin-set data/cache path in pyxis' log
              "container.nvcr-login-required", "container.enroot-configured-path-not-creatable",
              # docker's platform warning, runc's exec format error on a bin/ program, a
              # manifest list without this platform, QEMU's own crash line
              "container.image-arch-mismatch", "container.foreign-arch-emulation-crash",
              # dockerd's, Docker clients' and the runtimes' own words, and the WSL driver store's notice
              "container.dockerd-option-in-flag-and-daemon-json",
              "container.docker-socket-permission-denied",
              "container.wsl-ldconfig-libcuda-not-symlink-benign",
              "container.driver-capabilities-lack-video",
              # the GPU operator's driver container's own words (no kernel packages, modules in
              # use), nvidia-ctk's CDI generation errors, a CDI hook binary runc cannot exec
              "container.gpu-operator-driver-no-kernel-headers",
              "container.driver-container-module-in-use",
              "container.cdi-generate-driver-libs-not-found",
              # registries' and apt's own words: an nvidia/cuda tag removed from Docker Hub, the
              # CUDA repository's rotated key, stored credentials refused; mksquashfs without
              # the compressor; Apptainer's chown refused on a network file system
              "container.cuda-image-tag-removed", "container.cuda-repo-key-rotated",
              "container.registry-stale-credentials", "container.mksquashfs-compressor-not-built",
              "container.apptainer-build-tmpdir-on-network-fs",
              # ollama's server refused the registry without the shell's proxy
              "container.ollama-server-proxy-not-set",
              # CUDA's start-up "named symbol not found" under Docker on WSL 2 (a toolkit older
              # than the Windows driver): the words, read by the pattern
              "container.wsl-toolkit-older-than-windows-driver",
              # the kernel's EPERM for NUMA memory-policy calls (numactl, hwloc, libnuma users)
              "container.numa-syscalls-blocked",
              # modes read by their catalogue patterns alone: one wording each
              "container.hook-refused-in-csv-or-cdi-mode", "container.enroot-manifest-not-found",
              "container.driver-init-timeout-no-persistence",
              "container.display-capability-no-modeset-node",
              "container.enroot-helpers-lack-file-caps",
              "container.apptainer-squashfs-tools-not-found",
              # glibc's own start-up line, the same words in every image and binary
              "container.glibc-needs-newer-kernel",
              # shadow-utils' and Apptainer's words for newuidmap without its privileges
              "container.newuidmap-no-privilege",
              # kubelet's sandbox events in CRI-O's and dockershim's words, and gVisor's boot refusal
              "container.k8s-runtimeclass-not-applicable",
              "container.gvisor-nvproxy-unsupported-driver",
              # Go's resolver and net/http timeout on a registry, the NGC entrypoint's banner
              "container.registry-dns-lookup-failed", "container.docker-daemon-proxy-not-set",
              "container.ngc-image-predates-gpu",
              # Apptainer's cache race, Singularity 2's SIF refusal, a registry's TLS re-signed
              "container.apptainer-cache-concurrent-pull", "container.singularity2-cannot-read-sif",
              "container.registry-tls-intercepted"}


def row(url_tail: str) -> dict:
    return next(r for r in ROWS if r["url"].endswith(url_tail))


def parts(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(r.mode, dict(r.parts)) for r in container.read(text)]


@pytest.mark.parametrize("symptom", [r for r in ROWS if r["mode"] not in BY_PATTERN],
                         ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_each_symptom_reads_as_its_mode(symptom):
    readings = container.read(symptom["text"])
    assert symptom["mode"] in [r.mode for r in readings], [r.mode for r in readings]
    assert all(r.family == "container" and r.text for r in readings)


def test_nvidia_container_cli_stage_decides():
    mode, got = parts(row("boreshkinai/delta-interpolator/issues/10")["text"])[0]
    assert (mode, got["stage"], got["library"]) == (
        "container.host-driver-missing", "initialization", "libnvidia-ml.so.1")
    mode, got = parts(row("SyneRBI/PETRIC2/issues/27")["text"])[0]
    assert (mode, got["cuda"]) == ("container.driver-too-old-for-image", "12.8")
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/1442")["text"])[0]
    assert (mode, got["requires"]) == ("container.driver-too-old-for-image", "cuda>=11.0")
    mode, got = parts(row("BIOP/BIOP-desktop/issues/2")["text"])[0]
    assert mode == "container.image-ships-driver-libs"
    assert got["path"].endswith("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    # The hook's name cut by the line wrap of the paste: the mount error is still read.
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/825")["text"])[0]
    assert (mode, got["path"].rsplit("/", 1)[-1]) == ("container.image-ships-driver-libs",
                                                      "nvidia-smi")


def test_the_old_drivers_volume_names_the_driver_change():
    # nvidia-docker 1 names its volume after the driver version the container was made with;
    # the sentence's full stop is not part of the version.
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/493")["text"])[0]
    assert (mode, got["volume"], got["driver"]) == (
        "container.stale-after-driver-change", "nvidia_driver_381.22", "381.22")
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/80")["text"])[0]
    assert (mode, got["driver"]) == ("container.stale-after-driver-change", "352.79")
    # The same Unknown Error after kubelet's CPU manager rewrote the cgroup: the one mode.
    assert parts(row("kubernetes/kubernetes/issues/77073")["text"])[0][0] == \
        "container.gpu-lost-after-daemon-reload"


def test_device_request_and_driver_not_loaded():
    mode, got = parts(row("DeepLabCut/Docker4DeepLabCut2.0/issues/39")["text"])[0]
    assert (mode, got["stage"], got["device"]) == (
        "container.requested-gpu-not-present", "device", "1")
    mode, got = parts(row("HonuRobotics/dockwater/pull/10")["text"])[0]
    assert (mode, got["nvml"]) == ("container.host-driver-missing", "driver not loaded")


def test_docker_daemon_without_the_toolkit():
    mode, got = parts(row("NVIDIA/dcgm-exporter/issues/33")["text"])[0]
    assert (mode, got["driver"]) == ("container.nvidia-toolkit-broken", "")
    mode, got = parts(row("dusty-nv/jetson-containers/issues/122")["text"])[0]
    assert (mode, got["runtime"]) == ("container.nvidia-toolkit-broken", "nvidia")


def test_apptainer_flag_after_the_image_and_nothing_bound():
    mode, got = parts(row("jade-hpc-gpu/jade-hpc-gpu.github.io/issues/82")["text"])[0]
    assert (mode, got["flag"]) == ("container.apptainer-no-nv", "--nv")
    mode, got = parts(row("apptainer/singularity/issues/1829")["text"])[0]
    assert (mode, got["command"]) == ("container.nv-host-libs-not-found", "nvidia-smi")
    # The user's own program missing is not a GPU binding problem.
    assert parts("/.singularity.d/actions/exec: line 9: exec: train.py: not found") == []


def test_apptainer_build_dir_full():
    mode, got = parts(row("sheynkman-lab/LRP2/issues/144")["text"])[0]
    assert (mode, got["temp dir"]) == ("container.apptainer-tmpdir-full", "/tmp/")


def test_pyxis_squashfs_without_room():
    mode, got = parts(row("NVIDIA/pyxis/issues/41")["text"])[0]
    assert (mode, got["squashfs"]) == ("container.pyxis-runtime-path-full",
                                       "/run/pyxis/1000/7.0.squashfs")


def test_enroot_uri_with_a_registry_host_before_a_slash():
    mode, got = parts(row("NVIDIA/pyxis/issues/39")["text"])[0]
    assert (mode, got["registry"], got["write"]) == (
        "container.enroot-registry-uri-without-hash", "nvcr.io", "nvcr.io#nvidia/pytorch")
    # A Docker Hub repository (no dots in its namespace) is not this
    assert parts("[ERROR] URL https://registry-1.docker.io/v2/library/ubuntu/manifests/22.04 "
                 "returned error code: 404 Not Found") == []


def test_nvml_inside_the_container():
    assert parts(row("NVIDIA/nvidia-docker/issues/1671")["text"])[0][0] == (
        "container.gpu-lost-after-daemon-reload")
    assert parts(row("NVIDIA/nvidia-docker/issues/676")["text"])[0][0] == (
        "container.selinux-blocks-driver-libs")


def test_kfd_missing_in_the_container_and_bind_points():
    mode, got = parts("ROCk module is loaded\nUnable to open /dev/kfd read-write: No such file "
                      "or directory\nFailed to get user name to check for video group "
                      "membership")[0]
    assert (mode, got["device"], got["inside"]) == (
        "container.apptainer-no-nv", "/dev/kfd", "a container (its uid is not in the image's passwd)")
    mode, got = parts(row("apptainer/apptainer/issues/728")["text"])[0]
    assert (mode, got["destination"]) == ("container.bind-destination-missing", "/data")
    # Singularity 2.x without overlay: --nv's bind points missing in the image
    mode, got = parts(row("apptainer/singularity/issues/1182")["text"])[0]
    assert (mode, got["destination"]) == ("container.bind-destination-missing",
                                          "/usr/bin/nvidia-smi")


def test_nccl_across_the_docker_bridge():
    # the peer advertised its container's bridge address (nccl#929)
    mode, got = parts(row("NVIDIA/nccl/issues/929")["text"])[0]
    assert (mode, got["peer"], got["container"]) == (
        "container.network-isolation", "172.17.0.2", "e57377aacbb6")
    # a container that cannot bind the hosts' address (nccl#331): its eth0 is on the bridge
    mode, got = parts(row("NVIDIA/nccl/issues/331")["text"])[0]
    assert (mode, got["container"], got["failure"], got["address"]) == (
        "container.network-isolation", "e82c50601d13", "cannot bind the address asked for",
        "eth0 172.17.0.3")


def test_the_same_socket_errors_on_a_host_are_not_the_bridge():
    text = row("NVIDIA/nccl/issues/929")["text"]
    # a routable peer, or the host's own docker0 (.1), from a host that is not a container id
    assert parts(text.replace("172.17.0.2", "10.0.0.2").replace("e57377aacbb6", "node1")) == []
    assert parts(text.replace("172.17.0.2", "172.17.0.1").replace("e57377aacbb6", "node1")) == []
    assert parts(row("NVIDIA/nccl/issues/331")["text"].replace("e82c50601d13", "gpu2")) == []
    # a container id on a line that is not a network failure says nothing about the network
    assert parts("cf0b62962198:378932:380974 [0] include/shm.h:28 NCCL WARN Call to "
                 "posix_fallocate failed : No space left on device") == []


def test_no_bootstrap_interface_in_a_container_names_both_causes():
    # NCCL's subnet WARN names the address it was asked to reach: comm.no-bootstrap-interface
    # first, the container's bridge network second; a container with no socket at all is the
    # bridge (or no network) first.
    for comm_row in symptoms.rows("comm"):
        if comm_row["mode"] == "comm.no-bootstrap-interface":
            _, _, sure, _ = explain_text(comm_row["text"])
            assert [m.id for m in sure][:2] == ["comm.no-bootstrap-interface",
                                                "container.network-isolation"]
    bare = ("include/socket.h:344 WARN Socket creation failed : Address family not supported by "
            "protocol")
    _, _, sure, _ = explain_text("3f2a9c41b7d0:3171:3171 [0] " + bare)
    assert sure[0].id == "container.network-isolation"
    _, _, sure, _ = explain_text(bare)
    assert [m.id for m in sure] == ["comm.no-bootstrap-interface"]


def test_the_hooks_cgroup_stage_names_v1_only_or_rootless():
    # the container stage looking for cgroup v1's devices controller on a v2 host
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/1447")["text"])[0]
    assert (mode, got["stage"], got["cgroup"]) == (
        "container.toolkit-lacks-cgroup-v2", "container", "cgroup subsystem devices not found")
    # the GPU operator's nvidia-container-cli.real says the same
    assert parts("nvidia-container-cli.real: container error: cgroup subsystem devices not "
                 "found: unknown")[0][0] == "container.toolkit-lacks-cgroup-v2"
    # the mount stage not allowed to edit the device cgroup: v1's file, v2's eBPF filter
    mode, got = parts(row("moby/moby/issues/38729")["text"])[0]
    assert (mode, got["cgroup"]) == ("container.rootless-device-cgroup",
                                     "v1 /sys/fs/cgroup/devices/user.slice/devices.allow")
    mode, got = parts(row("NVIDIA/nvidia-container-toolkit/issues/1487")["text"])[0]
    assert (mode, got["cgroup"]) == ("container.rootless-device-cgroup", "v2 eBPF device filter")
    # a mount error about a file the image ships is not the cgroup
    assert "container.rootless-device-cgroup" not in [m for m, _ in parts(
        row("BIOP/BIOP-desktop/issues/2")["text"])]


def test_cdi_names_and_wsl_adapters():
    mode, got = parts(row("NVIDIA/nvidia-container-toolkit/issues/1239")["text"])[0]
    assert (mode, got["device"], got["runtime"]) == (
        "container.cdi-spec-unresolved",
        "management.nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead", "kubelet")
    mode, got = parts(row("NixOS/nixpkgs/issues/420638")["text"])[0]
    assert (mode, got["device"]) == ("container.cdi-spec-unresolved", "nvidia.com/gpu=all")
    # the toolkit's own words, even with its name mistyped in the paste
    for tail in ("AbdBarho/stable-diffusion-webui-docker/issues/117",
                 "IDEA-Research/Grounded-Segment-Anything/issues/506"):
        assert parts(row(tail)["text"])[0][0] == "container.wsl-no-gpu-adapter"


def test_rdma_devices_listed_but_not_openable():
    mode, got = parts(row("NVIDIA/nccl/issues/451")["text"])[0]
    assert (mode, got["device"]) == ("container.rdma-devices-not-passed", "mlx5_bond_0")
    mode, got = parts(row("ofiwg/libfabric/issues/12708")["text"])[0]
    assert (mode, got["errno"]) == ("container.rdma-devices-not-passed", "2")
    mode, got = parts("ip-172-31-3-90:1929:1937 [0] nccl_net_ofi_rdma_init:7978 NCCL WARN "
                      "NET/OFI OFI fi_getinfo() call failed: No data available")[0]
    assert (mode, got["plugin"]) == ("container.rdma-devices-not-passed", "aws-ofi-nccl")
    # a node with no RDMA device at all (every healthy VM's NCCL log) says nothing
    assert parts("vm:522:522 [0] NCCL INFO NET/IB : No device found.") == []
    _, _, sure, _ = explain_text("vm:522:522 [0] NCCL INFO NET/IB : No device found.")
    assert "container.rdma-devices-not-passed" not in [m.id for m in sure]


def test_other_families_and_empty_text_give_no_reading():
    assert container.read("") == []
    assert container.read("RuntimeError: HIP error: invalid device function") == []
    assert container.read("ImportError: libcudnn.so.8: cannot open shared object file: No "
                          "such file or directory") == []
    assert container.read("ncclSystemError: System call (e.g. socket, malloc) or external "
                          "library call failed or device error.") == []


def _lookalike(url_end: str) -> str:
    import json
    from pathlib import Path
    path = Path(__file__).parent / "fixtures" / "explain_lookalikes" / "container.jsonl"
    return next(r["text"] for r in map(json.loads, path.read_text().splitlines())
                if r["url"].endswith(url_end))


def test_a_squashfs_file_given_without_a_path_is_read_as_a_registry_image():
    for tail, name in (("NVIDIA/pyxis/issues/67", "cont.sqsh"),
                       ("NVIDIA/pyxis/issues/127", "hello-world.sqsh")):
        got = dict(parts(row(tail)["text"]))["container.pyxis-sqsh-path-as-image"]
        assert got["file"] == name and got["write"].startswith("./" + name)
    # a path (./ or /) is the file itself; a registry image is no file
    for fine in ("pyxis: importing docker image: ./hello-world.sqsh",
                 "pyxis: importing docker image: /shared/images/pytorch.sqsh",
                 "pyxis: importing docker image: nvcr.io#nvidia/pytorch:24.01-py3"):
        assert "container.pyxis-sqsh-path-as-image" not in dict(parts(fine)), fine
        _, _, sure, _ = explain_text(fine)
        assert "container.pyxis-sqsh-path-as-image" not in [m.id for m in sure]


def test_a_sif_unpacked_to_a_full_temp_dir_reads_the_dir():
    got = dict(parts(row("Gabaldonlab/perSVade/issues/9")["text"]))
    assert got["container.apptainer-tmpdir-full"]["temp dir"] == "/tmp/"
    assert "sandbox" in got["container.apptainer-tmpdir-full"]["step"]
    got = dict(parts(row("cgroza/GraffiTE/issues/37")["text"]))
    assert got["container.apptainer-tmpdir-full"]["temp dir"] == "/tmp/"
    # an extraction that failed for another reason (a missing /etc/passwd) is not the space
    other = ("FATAL:   while extracting /fast/x.simg: root filesystem extraction failed: extract "
             "command failed: WARNING: passwd file doesn't exist in container, not updating")
    assert "container.apptainer-tmpdir-full" not in dict(parts(other))


def test_enroots_einval_user_namespace_is_no_disabled_namespace():
    # enroot#195: a uid above 2^31 written negative into uid_map (EINVAL); namespaces work
    text = _lookalike("NVIDIA/enroot/issues/195")
    assert "container.apptainer-userns-disabled" not in dict(parts(text))
    disabled = "ERROR  : Failed to create user namespace: user namespace disabled"
    assert "container.apptainer-userns-disabled" in dict(parts(disabled))


def test_enroot_runtime_folder_refused():
    """enroot's runtime path under XDG_RUNTIME_DIR: /run/user/UID that no login session made
    (enroot#13), /run/enroot after XDG_RUNTIME_DIR fell back to /run (enroot#23), also through
    pyxis; other tools' mkdir refusals elsewhere, and Go runtimes' wording, are not it."""
    got = parts(row("enroot/issues/13")["text"])
    assert got == [("container.enroot-runtime-path-not-writable", {
        "directory": "/run/user/140196", "variable": "ENROOT_RUNTIME_PATH", "via": "",
        "why": "XDG_RUNTIME_DIR names /run/user/UID, which no login session created on this node"})]
    pyxis = ("slurmstepd: error: pyxis: printing contents of log file ...\n"
             "slurmstepd: error: pyxis:     mkdir: cannot create directory '/run/enroot': "
             "Permission denied\n")
    (mode, p), = parts(pyxis)
    assert mode == "container.enroot-runtime-path-not-writable"
    assert p["directory"] == "/run/enroot" and p["via"] == "pyxis" and "unset" in p["why"]
    _, _, sure, _ = explain_text(row("enroot/issues/23")["text"])
    assert sure[0].id == "container.enroot-runtime-path-not-writable"
    # healthy twins: another folder, another errno, a Go runtime's wording
    for text in ("mkdir: cannot create directory '/run/lock/x': Permission denied",
                 "mkdir: cannot create directory '/run/enroot': File exists",
                 "ERRO[0000] mkdir /run/user/0/runc: permission denied",
                 "mkdir: cannot create directory 'pool': Permission denied"):
        assert not [m for m, _ in parts(text) if m == "container.enroot-runtime-path-not-writable"]
        ids = [m.id for m in explain_text(text)[2] + explain_text(text)[3]]
        assert "container.enroot-runtime-path-not-writable" not in ids, (text, ids)


def test_enroot_hook_without_nvidia_container_cli():
    """enroot's 98-nvidia.sh says "Command not found: nvidia-container-cli" (pyxis#101), Docker's
    hook "couldn't find binary nvidia-container-cli" (nvidia-docker#973): the same missing
    libnvidia-container-tools; another command not found is not it."""
    (mode, p), = parts(row("pyxis/issues/101")["text"])
    assert mode == "container.nvidia-toolkit-broken" and p["missing"] == "nvidia-container-cli"
    assert not parts("[ERROR] Command not found: mksquashfs, see https://example.invalid")


def test_apparmor_confined_user_namespace_refuses_setgroups():
    """Ubuntu 24.04's AppArmor confines the user namespace of an Apptainer without its profile:
    the starter may not write setgroups (apptainer#2457, #2691); another FATAL of Apptainer,
    and newgidmap's own failure before the same 'waiting event' line, are not it."""
    (mode, p), = parts(row("apptainer/issues/2457")["text"])
    assert mode == "container.apptainer-userns-disabled" and "setgroups" in p["why"]
    _, _, sure, _ = explain_text(row("apptainer/issues/2691")["text"])
    assert sure[0].id == "container.apptainer-userns-disabled"
    for text in ("FATAL:   failed to retrieve group information for 0: group: unknown group 0",
                 "ERROR  : 'newgidmap' execution failed. Check that 'newgidmap' is setuid root or "
                 "has setcap cap_setgid+eip.\nERROR  : Error while waiting event for user "
                 "namespace mappings: Success"):
        assert "container.apptainer-userns-disabled" not in dict(parts(text))


def test_underlay_bind_mount_notice_is_never_the_cause():
    """--nv's underlay notice (singularity#3250, singularityhub#166) is read alone as a benign
    notice; beside a real error in a log the real error is named."""
    (mode, p), = parts(row("singularity/issues/3250")["text"])
    assert mode == "container.apptainer-underlay-notice-benign"
    assert p["path"] == "/usr/bin/nvidia-smi"
    (_, p), = parts("INFO:    underlay of /usr/bin/nvidia-smi required more than 50 (374) "
                    "bind mounts")
    assert p["binds"] == "374"
    log = ("INFO:    underlay of /usr/bin/nvidia-smi required more than 50 (751) bind mounts\n"
           "INFO:    Converting SIF file to temporary sandbox...\n"
           "ERROR  : Failed to create user namespace: user namespace disabled\n")
    assert [m for m, _ in parts(log)] == ["container.apptainer-userns-disabled"]
    log = ("WARNING: underlay of /usr/bin/nvidia-smi required more than 50 (374) bind mounts\n"
           "Traceback (most recent call last):\n"
           "  File \"train.py\", line 9, in <module>\n"
           "    torch.cuda.init()\n"
           "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
           "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx\n")
    _, _, sure, weak = explain_text(log)
    assert sure and sure[0].id != "container.apptainer-underlay-notice-benign", [m.id for m in sure]


def test_a_toolkit_binary_that_is_gone_is_named():
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/686")["text"])[0]
    assert (mode, got["missing"]) == ("container.nvidia-toolkit-broken",
                                      "nvidia-container-runtime")
    mode, got = parts(row("NVIDIA/nvidia-docker/issues/1017")["text"])[0]
    assert (mode, got["missing"]) == ("container.nvidia-toolkit-broken",
                                      "nvidia-container-runtime-hook")
    # the same words for another binary are not the toolkit's
    assert parts("fork/exec /usr/bin/runc: no such file or directory: unknown") == []


def test_the_device_plugin_without_the_nvidia_runtime():
    mode, got = parts(row("NVIDIA/k8s-device-plugin/issues/11")["text"])[0]
    assert (mode, got["program"]) == ("container.no-gpu-runtime", "k8s-device-plugin")


def test_the_schedulers_no_gpu_node_reads_its_counts():
    """Kubernetes' FailedScheduling event (NVIDIA/k8s-device-plugin#165) is read with its
    counts; the bare words (#71's paraphrase) still name the request; a pod Pending for another
    resource (memory) gives no reading."""
    [(mode, got)] = parts(row("k8s-device-plugin/issues/165")["text"])
    assert (mode, got["nodes"], got["without enough"]) == (
        "container.k8s-gpu-request-exceeds-node", "3", "3")
    assert parts(row("k8s-device-plugin/issues/71")["text"])[0][1]["nodes"] == ""
    assert not parts("0/4 nodes are available: 4 Insufficient memory.")


def test_pthread_create_refused_with_eperm_is_the_seccomp_profile_not_a_limit():
    """EPERM from pthread_create (OpenBLAS at HumanSignal/label-studio#3121, with RLIMIT_NPROC
    -1: no limit) is the engine's seccomp profile refusing clone3; the same OpenBLAS line with
    EAGAIN is the thread limit (system.thread-limit), never this."""
    [(mode, got)] = parts(row("HumanSignal/label-studio/issues/3121")["text"])
    assert (mode, got["error"], got["caller"]) == (
        "container.seccomp-blocks-clone3", "EPERM", "OpenBLAS blas_thread_init")
    eagain = ("OpenBLAS blas_thread_init: pthread_create failed for thread 50 of 64: Resource "
              "temporarily unavailable\nOpenBLAS blas_thread_init: RLIMIT_NPROC 4096 current, "
              "513046 max")
    assert not parts(eagain)
    assert explain_text(eagain)[2][0].id == "system.thread-limit"
    sure = explain_text(row("HumanSignal/label-studio/issues/3121")["text"])[2]
    assert [m.id for m in sure] == ["container.seccomp-blocks-clone3"]


def test_ngcs_banner_and_docker_hubs_pull_limit_read_their_parts():
    """The NGC entrypoint's banner gives both driver releases (NVIDIA/TensorRT-LLM#23); enroot's
    429 from Docker Hub after an anonymous login says the pull was anonymous
    (CityBrainChallenge starter-kit#14); another registry's 429 is not Docker Hub's limit."""
    [(mode, got)] = parts(row("NVIDIA/TensorRT-LLM/issues/23")["text"])
    assert (mode, got["image needs driver"], got["host driver"]) == (
        "container.driver-too-old-for-image", "535.86", "510.85.02")
    [(mode, got)] = parts(row("KDDCup2021-CityBrainChallenge-starter-kit/issues/14")["text"])
    assert (mode, got["pull"]) == ("container.registry-pull-rate-limit", "anonymous")
    assert not parts("[ERROR] URL https://nvcr.io/v2/nvidia/pytorch/manifests/24.05-py3 "
                     "returned error code: 401")


def test_an_old_singularitys_squashfs_mount_and_a_rootless_single_id_map():
    """Singularity < 3.5.3's squashfs mount refused by a kernel >= 5.1 (2.x's wording at
    apptainer/singularity#5482); rootless Podman unpacking a file owned by an ID its
    single-ID namespace lacks names the IDs and the file (podman#3932); a squashfs image that is
    merely missing, and Podman's own permission error, are neither."""
    [(mode, got)] = parts(row("apptainer/singularity/issues/5482")["text"])
    assert (mode, got["runtime"]) == ("container.singularity-too-old-for-kernel",
                                      "Singularity 2.x")
    [(mode, got)] = parts(row("podman-container-tools/podman/issues/3932")["text"])
    assert (mode, got["requested"], got["file"]) == (
        "container.rootless-userns-single-id", "0:42", "/etc/shadow")
    assert not parts("FATAL:   could not open image /scratch/x.sif: failed to retrieve path for "
                     "/scratch/x.sif: lstat /scratch/x.sif: no such file or directory")
    assert not parts("Error: open /run/user/1000/libpod: permission denied")


def test_containerd_without_the_nvidia_runtime_is_the_toolkit_not_registered():
    """kubelet's sandbox error from containerd's CRI names the runtime the RuntimeClass asked
    for; another runtime's handler missing (gVisor's runsc) is not the NVIDIA toolkit's."""
    mode, got = parts(row("NVIDIA/gpu-operator/issues/432")["text"])[0]
    assert (mode, got["runtime"]) == ("container.nvidia-toolkit-broken", "nvidia")
    other = ('Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get '
             'sandbox runtime: no runtime for "runsc" is configured')
    assert "container.nvidia-toolkit-broken" not in [m for m, _ in parts(other)]


def test_a_gpu_asked_of_docker_on_a_mac_is_no_gpu_not_the_toolkit():
    """Docker Desktop on a Mac has no NVIDIA GPU to give: the daemon's "could not select device
    driver" there is the machine, named with the platform; on a Linux host it stays the toolkit."""
    mode, got = parts(row("Deep-MI/FastSurfer/issues/56")["text"])[0]
    assert (mode, got["platform"]) == ("gpu.no-gpu-on-node", "MacBook")
    linux = ('docker: Error response from daemon: could not select device driver "" with '
             'capabilities: [[gpu]].')
    assert [m for m, _ in parts(linux)] == ["container.nvidia-toolkit-broken"]


def test_a_driver_replaced_under_a_running_docker_names_the_file_gone():
    """The toolkit's hook cannot mount the new driver's procfs files into a container that a
    daemon started before the driver change: the file it missed is the part; another mount
    error (a library of the image) is not the driver change."""
    mode, got = parts(row("NVIDIA/nvidia-container-toolkit/issues/169")["text"])[0]
    assert (mode, got["missing"]) == ("container.stale-after-driver-change",
                                      "/proc/driver/nvidia/params/version/registry")
    other = ("nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/"
             "x/merged/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1: file exists")
    assert "container.stale-after-driver-change" not in [m for m, _ in parts(other)]
