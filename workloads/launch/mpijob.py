"""``dsenv launch --k8s``: the same workload as a Kubeflow MPIJob (kubeflow.org/v2beta1).

A launcher pod runs ``mpirun -np NODES*G`` and the operator starts NODES worker pods (sshd)
with G slots each (the mpi-operator's examples, github.com/kubeflow/mpi-operator): GPUs as
the workers' resource limits, a data set volume and a shared cache volume (Hugging Face cache
and outputs), the user's UID/GID in the security context. Fixed choices are data
(workloads/mpijob.toml). The manifest is plain data, written with PyYAML's safe_dump.
"""

from __future__ import annotations

import os
import re

from dsenv.data import load_table
from dsenv.envs.launchers import OFFLINE_VARIABLES
from dsenv.provision.record.activation import ACTIVATE_NAME
from dsenv.workloads.errors import LaunchError
from dsenv.workloads.launch.jobscript import WORKLOAD_MODULE, JobPlan

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63
_SHELL_EXPANSION = re.compile(r"\$")


def settings() -> dict:
    return load_table("dsenv.workloads", "mpijob.toml")


def job_name(plan: JobPlan, requested: str | None = None) -> str:
    """A DNS-1123 label that stays one with the operator's ``-worker-<N-1>`` suffix."""
    suffix = f"-worker-{plan.nodes - 1}"
    if requested:
        name = requested
    else:
        name = re.sub(r"[^a-z0-9-]+", "-", f"dsenv-{plan.workload}-{plan.mode}".lower()).strip("-")
        name = name[:DNS_LABEL_MAX - len(suffix)].rstrip("-")
    if not DNS_LABEL.fullmatch(name) or len(name + suffix) > DNS_LABEL_MAX:
        raise LaunchError(f"--job-name {name!r}: an MPIJob name must be a DNS-1123 label (a-z, "
                          f"0-9, '-', at most {DNS_LABEL_MAX - len(suffix)} characters here, "
                          "so that its pods' host names are too)")
    return name


def image_of(plan: JobPlan) -> str:
    if plan.container is None or not plan.container.image:
        raise LaunchError("--k8s needs an image: --container docker:REGISTRY/IMAGE:TAG (or a "
                          "site whose profile names one)")
    image = plan.container.image.removeprefix("docker://")
    if image.startswith(("/", ".", "$")) or image.endswith(".sif"):
        raise LaunchError(f"--k8s: {plan.container.image} is an image file; Kubernetes pulls "
                          "images from a registry: --container docker:REGISTRY/IMAGE:TAG")
    return image


def _environment(plan: JobPlan, config: dict, name: str) -> dict[str, str]:
    env: dict[str, str] = {}
    if not plan.on_gpus:
        env["DS_ACCELERATOR"] = "cpu"
    env["HF_HOME"] = config["paths"]["hf_home"]
    if plan.site.offline_on_compute:
        env.update({v: "1" for v in OFFLINE_VARIABLES})
    env["OMP_NUM_THREADS"] = str(plan.cpus_per_rank)
    # Rank 0 runs on the first worker: the operator's service gives it this host name.
    env["MASTER_ADDR"] = f"{name}-worker-0.{name}"
    env["MASTER_PORT"] = str(config["master_port"])
    for key, value in plan.site.env.items():
        if not _SHELL_EXPANSION.search(value):  # ${SLURM_...} means nothing in a pod
            env.setdefault(key, value)
    return env


def _container(name: str, image: str, command: list[str], env: dict[str, str] | None,
               resources: dict, mounts: list[dict]) -> dict:
    container = {"name": name, "image": image, "command": command}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    container["resources"] = resources
    if mounts:
        container["volumeMounts"] = mounts
    return container


def render_mpijob(plan: JobPlan, output_dir: str | None = None,
                  requested_name: str | None = None) -> dict:
    """The MPIJob for ``plan`` (a dict ready for :func:`to_yaml`)."""
    config = settings()
    name = job_name(plan, requested_name)
    image = image_of(plan)
    uid, gid = os.getuid(), os.getgid()
    ssh = config["ssh"]["root" if uid == 0 else "user"]
    env = _environment(plan, config, name)
    output = output_dir or f"{config['paths']['output']}/{name}"

    program = ["python", "-m", WORKLOAD_MODULE, plan.mode, plan.workload]
    if plan.deepspeed_config:
        program += ["--deepspeed-config", plan.deepspeed_config]
    program += [*plan.workload_args, "--output-dir", output]
    if plan.env_prefix:
        program = ["bash", "-c", '. "$1" && shift && exec "$@"', "dsenv-activate",
                   f"{plan.env_prefix}/{ACTIVATE_NAME}", *program]
    exported = [word for key in env for word in ("-x", key)]
    launcher_command = ["mpirun", *ssh["mpirun_flags"], "-np", str(plan.world), *exported,
                        *program]

    volumes, mounts = [], []
    for volume, spec in config["volumes"].items():
        volumes.append({"name": volume,
                        "persistentVolumeClaim": {"claimName": spec["claim"],
                                                  "readOnly": spec["read_only"]}})
        mounts.append({"name": volume, "mountPath": spec["mount"], "readOnly": spec["read_only"]})
    limits: dict[str, object] = {"cpu": str(plan.ranks_per_node * plan.cpus_per_rank)}
    if plan.on_gpus:
        limits[config["gpu_resource"][plan.site.vendor]] = plan.ranks_per_node
    security = {"runAsUser": uid, "runAsGroup": gid, "fsGroup": gid}

    def replica(replicas: int, container: dict) -> dict:
        return {"replicas": replicas, "restartPolicy": config["restart_policy"],
                "template": {"spec": {"securityContext": security,
                                      "containers": [container],
                                      "volumes": volumes}}}

    return {
        "apiVersion": config["api_version"],
        "kind": config["kind"],
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "dsenv",
                                              "dsenv/workload": plan.workload}},
        "spec": {
            "slotsPerWorker": plan.ranks_per_node,
            "runPolicy": {"cleanPodPolicy": config["clean_pod_policy"],
                          "backoffLimit": config["backoff_limit"]},
            "sshAuthMountPath": ssh["auth_mount_path"],
            "mpiImplementation": config["mpi_implementation"],
            "mpiReplicaSpecs": {
                "Launcher": replica(1, _container(
                    "launcher", image, launcher_command, env,
                    {"limits": dict(config["launcher_resources"])}, mounts)),
                "Worker": replica(plan.nodes, _container(
                    "worker", image, list(ssh["worker_command"]), env,
                    {"limits": limits, "requests": dict(limits)}, mounts)),
            },
        },
    }


# -- YAML ----------------------------------------------------------------------------------
HEADER = ("# Written by dsenv launch --k8s: `kubectl apply -f FILE` (needs the Kubeflow MPI "
          "operator).\n")


def to_yaml(document: dict) -> str:
    """Block-style YAML, keys in the manifest's order, long commands on one line each."""
    import yaml  # yaml: kept off dsenv --help

    return HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=False,
                                   allow_unicode=True, width=1 << 16)
