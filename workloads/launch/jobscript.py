"""The sbatch script ``dsenv launch`` writes: one bash file that prepares the node, checks it
with ``dsenv doctor --target compute`` and then starts the workload's ranks.

In order: ``#SBATCH`` lines, ``set -euo pipefail``, the site's modules, the environment
(``. PREFIX/activate`` of a dsenv environment), DS_ACCELERATOR for CPU jobs, the Hugging
Face cache and offline variables, OMP_NUM_THREADS from the CPUs Slurm gave each task, the
site's variables, MASTER_ADDR (the allocation's first node, unless already exported) and
MASTER_PORT (derived from the job id, so two jobs never collide), the preflight doctor
(its failure ends the job before any rank starts, with its findings in the job output), then
the launcher line of envs/launchers.toml.

Quoting: every path and argument that enters the script is quoted (single words, no shell
interpretation); only ``$NAME``/``${NAME...}`` expansions written in the launcher table or
in the site profile are expanded, when the job runs. The preflight and launcher commands
are bash arrays, so the job output shows them exactly as they run (``printf %q``).
Nothing from the submitting environment is copied into the script (no credentials).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dsenv import __version__
from dsenv.envs.launchers import (
    OFFLINE_VARIABLES,
    REMOTE_ENV_NAMES,
    REMOTE_ENV_PREFIXES,
    REMOTE_ENV_SKIPPED,
    launch_table,
)
from dsenv.envs.sites import Container, Site
from dsenv.provision.record.activation import ACTIVATE_NAME, sh_value
from dsenv.redact import SECRET_WORDS
from dsenv.workloads.errors import LaunchError

WORKLOAD_MODULE = "dsenv.workloads.cli"
# Same derivation as dsenv.workloads.launch.env for srun ranks without MASTER_PORT.
MASTER_PORT_EXPRESSION = "$((20000 + SLURM_JOB_ID % 20000))"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_SCALAR = re.compile(r"[A-Za-z0-9_.-]+")


def table() -> dict:
    """envs/launchers.toml: the launcher lines and container runtimes."""
    return launch_table()


@dataclass(frozen=True)
class JobPlan:
    workload: str
    mode: str  # smoke | run
    launcher: str  # srun | mpirun | deepspeed | torchrun
    nodes: int
    ranks_per_node: int  # --gpus-per-node: one rank per GPU (or per CPU slot with --cpu)
    site: Site
    python: str  # the interpreter the ranks run
    output_dir: str  # the workload's --output-dir; "-<job id>" is appended in the job
    job_output_dir: str  # where Slurm writes %x-%j.out
    on_gpus: bool = True  # False: CPU ranks, no GPU requested (DS_ACCELERATOR=cpu)
    cpus_per_rank: int = 1
    container: Container | None = None
    env_prefix: str | None = None  # a dsenv environment: PREFIX/activate is sourced
    # the interpreter dsenv itself runs in when the script is made: the preflight doctor
    # runs from it (an environment built by `dsenv provision` holds no dsenv) and judges the
    # activated environment (DSENV_ENV); "" = the ranks' python, which has dsenv
    doctor_python: str = ""
    workload_args: tuple[str, ...] = ()
    deepspeed_config: str | None = None
    job_name: str = ""
    account: str | None = None
    partition: str | None = None
    time: str | None = None
    srun_mpi: str = "pmix"
    srun_mpi_origin: str = ""
    command_line: str = ""  # how the script was made, for its header
    extra_binds: tuple[str, ...] = field(default_factory=tuple)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def spec(self) -> dict:
        return table()["launcher"][self.launcher]

    @property
    def one_task_per_node(self) -> bool:
        return self.spec["tasks_per_node"] == "one"


# -- quoting -------------------------------------------------------------------------------


def _escape_literal(text: str) -> str:
    """``text`` for the inside of double quotes, with nothing interpreted."""
    return re.sub(r'([\\"$`])', r"\\\1", text)


def shell_word(parts: Iterable[tuple[str, bool]]) -> str:
    """One shell word from (text, expand) parts: expand=True keeps ``$NAME``/``${NAME...}``
    expansions (launcher table, site profile); expand=False is taken literally (paths,
    arguments). Plain words stay bare for readability."""
    parts = list(parts)
    if all(not expand for _, expand in parts):
        return shlex.quote("".join(text for text, _ in parts))
    joined = "".join(text for text, _ in parts)
    if _SAFE_WORD.fullmatch(joined):
        return joined
    inner = "".join(sh_value(text)[1:-1] if expand else _escape_literal(text)
                    for text, expand in parts)
    return f'"{inner}"'


def literal(text: str) -> str:
    return shlex.quote(str(text))


def sbatch_value(value: str) -> str:
    """A value for an ``#SBATCH`` line: sbatch splits those lines on blanks and ends them at
    a ``#`` outside quotes; inside double quotes it takes ``\\"`` and ``\\\\`` (measured with
    Slurm 22.05, which does not honour a backslash before a blank outside quotes)."""
    if "\n" in value or "\r" in value:
        raise LaunchError(f"{value!r}: a newline cannot go into an #SBATCH line")
    if not re.search(r"[\\\"'#\s]", value):
        return value
    return '"' + re.sub(r'([\\"])', r"\\\1", value) + '"'


# -- launcher lines ------------------------------------------------------------------------


def _scalars(plan: JobPlan) -> dict[str, str]:
    values = {"nodes": str(plan.nodes), "gpus_per_node": str(plan.ranks_per_node),
              "world": str(plan.world), "srun_mpi": plan.srun_mpi}
    for name, value in values.items():
        if not _SCALAR.fullmatch(value):
            raise LaunchError(f"{name} {value!r} is not a plain word")
    return values


def render_words(words: Iterable[str], scalars: Mapping[str, str],
                 splices: Mapping[str, list[str]]) -> list[str]:
    """Launcher-table words -> shell words. A word that is exactly ``{name}`` of a splice is
    replaced by that list (already shell words); other ``{name}`` are scalars."""
    out: list[str] = []
    for word in words:
        whole = _PLACEHOLDER.fullmatch(word)
        if whole and whole.group(1) in splices:
            out += splices[whole.group(1)]
            continue

        unknown = set(_PLACEHOLDER.findall(word)) - set(scalars)
        if unknown:
            raise KeyError(f"launchers.toml: unknown placeholder(s) {sorted(unknown)} in {word!r}")
        filled = _PLACEHOLDER.sub(lambda m: scalars[m.group(1)], word)
        out.append(shell_word([(filled, True)]))
    return out


def _bind_words(container: Container, plan: JobPlan) -> list[str]:
    runtime = table()["container"][container.runtime]
    words: list[str] = []
    binds = [(bind, True) for bind in container.binds]  # site binds may say $SCRATCH
    binds += [(f"{path}:{path}", False) for path in plan.extra_binds]
    for bind, expand in binds:
        source, _, destination = bind.partition(":")
        destination = destination or source
        for template in runtime["bind"]:
            parts = []
            position = 0
            for match in _PLACEHOLDER.finditer(template):
                parts.append((template[position:match.start()], True))
                value = {"source": source, "destination": destination}[match.group(1)]
                parts.append((value, expand))
                position = match.end()
            parts.append((template[position:], True))
            words.append(shell_word(parts))
    return words


def container_words(plan: JobPlan) -> list[str]:
    """The runtime's exec words, binds and image; then, when the environment lives inside
    the image, a bash that sources its activate script and execs the rest."""
    words: list[str] = []
    if plan.container is not None:
        runtime = table()["container"][plan.container.runtime]
        words += [literal(w) for w in runtime["exec"]]
        words += _bind_words(plan.container, plan)
        words.append(literal(plan.container.image))
        if plan.env_prefix:
            words += ["bash", "-c", literal('. "$1" && shift && exec "$@"'), "dsenv-activate",
                      literal(f"{plan.env_prefix}/{ACTIVATE_NAME}")]
    return words


def module_words(plan: JobPlan) -> list[str]:
    args = [literal(WORKLOAD_MODULE), plan.mode, literal(plan.workload)]
    if plan.deepspeed_config:
        args += ["--deepspeed-config", literal(plan.deepspeed_config)]
    args += [literal(a) for a in plan.workload_args]
    args += ["--output-dir", '"$DSENV_OUTPUT_DIR"']
    return args


def launcher_words(plan: JobPlan) -> list[str]:
    spec = plan.spec
    single = spec.get("single_node_words", []) if plan.nodes == 1 else []
    splices = {"container": container_words(plan), "python": [literal(plan.python)],
               "module": module_words(plan),
               "single_node_words": [literal(w) for w in single]}
    return render_words(spec["words"], _scalars(plan), splices)


def doctor_words(plan: JobPlan) -> list[str]:
    doctor_python = plan.doctor_python if plan.container is None else ""
    words = [*container_words(plan), literal(doctor_python or plan.python), "-m", "dsenv",
             "doctor", "--target", "compute", "--launcher", plan.launcher,
             "--nodes", str(plan.nodes),
             # a CPU job asks for no GPU: 0 tells the doctor so (gpu.devices then passes)
             "--gpus-per-node", str(plan.ranks_per_node if plan.on_gpus else 0)]
    if doctor_python and plan.env_prefix:
        words += ["--env", literal(plan.env_prefix)]
    if plan.mode == "run":  # the smoke makes its own tiny model and data: no assets to check
        words += ["--for", literal(plan.workload)]
    if plan.deepspeed_config:
        words += ["--deepspeed-config", literal(plan.deepspeed_config)]
    return words


# -- the script ----------------------------------------------------------------------------


def _sbatch_lines(plan: JobPlan) -> list[str]:
    per_node = 1 if plan.one_task_per_node else plan.ranks_per_node
    cpus = plan.cpus_per_rank * (plan.ranks_per_node if plan.one_task_per_node else 1)
    options = [("job-name", plan.job_name), ("nodes", str(plan.nodes)),
               ("ntasks-per-node", str(per_node)), ("cpus-per-task", str(cpus))]
    if plan.on_gpus:
        options.append(("gpus-per-node", str(plan.ranks_per_node)))
    options += [(name, value) for name, value in (("account", plan.account),
                                                   ("partition", plan.partition),
                                                   ("time", plan.time)) if value]
    options.append(("output", f"{plan.job_output_dir}/%x-%j.out"))
    return [f"#SBATCH --{name}={sbatch_value(value)}" for name, value in options]


def _export_default(name: str, value_word: str) -> str:
    return f'[ -n "${{{name}+x}}" ] || export {name}={value_word}'


def _modules(site: Site) -> list[str]:
    commands = site.module_commands()
    if not commands:
        return []
    return [
        f"# -- modules of site {site.name} ({', '.join(site.sources) or 'site profile'})",
        "# A batch shell is not a login shell: make `module` available first.",
        "if ! command -v module >/dev/null 2>&1; then",
        "    set +u",
        "    for _dsenv_init in /etc/profile.d/lmod.sh /usr/share/lmod/lmod/init/bash \\",
        "                       /etc/profile.d/modules.sh /usr/share/modules/init/bash; do",
        '        if [ -r "$_dsenv_init" ]; then . "$_dsenv_init"; break; fi',
        "    done",
        "    set -u",
        "fi",
        *("module " + " ".join(literal(w) for w in words) for words in commands),
        "",
    ]


def _omp_threads(plan: JobPlan) -> str:
    if plan.one_task_per_node:  # the task's CPUs are shared by the node's ranks
        per = plan.ranks_per_node
        return (f"export OMP_NUM_THREADS=$(( ${{SLURM_CPUS_PER_TASK:-{per}}} / {per} ))\n"
                '[ "$OMP_NUM_THREADS" -ge 1 ] || OMP_NUM_THREADS=1')
    return 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"'


def _array(name: str, words: list[str], width: int = 92) -> str:
    """``NAME=( words )``, wrapped: a newline inside the parentheses only separates words."""
    lines, current = [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return f"{name}=(\n" + "".join(f"    {line}\n" for line in lines) + ")"


def _one_line(text: str) -> str:
    """``text`` for a comment line: a newline in it would end the comment and run the rest."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _remote_env_file() -> list[str]:
    """Bash that writes the variables other hosts' ranks need into DS_ENV_FILE, at job time.

    DeepSpeed's pdsh runner starts those ranks in a fresh ssh shell and carries only a few
    prefixes (runner.py EXPORT_ENVS) plus the lines of DS_ENV_FILE (default .deepspeed_env in
    ~ or the launch folder); it writes each line as `export NAME=VALUE;` for the remote shell,
    so values with quotes, `$` or backslashes are left out. Secrets never go into the file.
    """
    wanted = "|".join([f"{p}*" for p in REMOTE_ENV_PREFIXES] + list(REMOTE_ENV_NAMES)
                      + ["PATH"])
    secret = "|".join(f"*{w}*" for w in SECRET_WORDS)
    return [
        "# DeepSpeed's pdsh runner carries few variables to the other hosts: the rest go in",
        "# the file DS_ENV_FILE names (the doctor's launch.ds-env checks it).",
        'export DS_ENV_FILE="$DSENV_OUTPUT_DIR/.deepspeed_env"',
        ': > "$DS_ENV_FILE"',
        "for _dsenv_name in $(compgen -e); do",
        '    case "$_dsenv_name" in',
        f"        {'|'.join(REMOTE_ENV_SKIPPED)}|{secret}) continue ;;",
        f"        {wanted}) ;;",
        "        *) continue ;;",
        "    esac",
        """    case "${!_dsenv_name}" in ''|*$'\\n'*|*'"'*|*'$'*|*'`'*|*'\\\\'*) continue ;; esac""",
        """    printf '%s=%s\\n' "$_dsenv_name" "${!_dsenv_name}" >> "$DS_ENV_FILE\"""",
        "done",
    ]


def render_script(plan: JobPlan) -> str:
    site = plan.site
    mode_text = "smoke" if plan.mode == "smoke" else "full run"
    device = "GPU" if plan.on_gpus else "CPU slot"
    lines = [
        "#!/bin/bash",
        f"# dsenv launch: {plan.workload} {mode_text}, {plan.nodes} node(s) x "
        f"{plan.ranks_per_node} rank(s) (one per {device}), launcher {plan.launcher}, "
        f"site {site.name}.",
        f"# Written by dsenv {__version__}: {_one_line(plan.command_line)}" if plan.command_line
        else f"# Written by dsenv {__version__}.",
        "# Submit with sbatch. The preflight `dsenv doctor` stops the job before any rank "
        "starts",
        "# when the node cannot run it (its findings are in the job output).",
        *_sbatch_lines(plan),
        "",
        "set -euo pipefail",
        'if [ -z "${SLURM_JOB_ID:-}" ]; then',
        '    echo "dsenv launch: not inside a Slurm job (SLURM_JOB_ID unset): submit this '
        'script with sbatch" >&2',
        "    exit 2",
        "fi",
        'echo "dsenv launch: job $SLURM_JOB_ID on ${SLURM_JOB_NODELIST:-?}: '
        f'{plan.workload} {plan.mode} with {plan.launcher}, {plan.world} rank(s)"',
        "",
    ]
    lines += _modules(site)
    if plan.env_prefix and plan.container is None:
        lines += ["# -- the environment (dsenv provision wrote its activate script)",
                  f". {literal(f'{plan.env_prefix}/{ACTIVATE_NAME}')}",
                  'echo "dsenv launch: python is $(command -v python)"', ""]
    lines.append("# -- variables")
    if not plan.on_gpus:
        lines.append("export DS_ACCELERATOR=cpu  # CPU ranks: DeepSpeed's CPU accelerator, gloo")
    if site.hf_home:
        lines.append(_export_default("HF_HOME", sh_value(site.hf_home)))
    if site.offline_on_compute:
        lines.append(f"# Compute nodes of site {site.name} have no internet: the Hugging Face "
                     "libraries stay offline.")
        lines.append("export " + " ".join(f"{v}=1" for v in OFFLINE_VARIABLES))
    lines.append(_omp_threads(plan))
    if site.env:
        lines.append(f"# Network and runtime variables of site {site.name} (kept when "
                     "already set).")
        lines += [_export_default(name, sh_value(value)) for name, value in site.env.items()]
    for name, value in plan.spec.get("exports", {}).items():
        lines.append(f"export {name}={render_words([value], _scalars(plan), {})[0]}")
    lines += [
        "",
        "# -- rendezvous: the allocation's first node; a port per job",
        'mapfile -t DSENV_HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'if [ "${#DSENV_HOSTS[@]}" -eq 0 ]; then',
        '    echo "dsenv launch: \\`scontrol show hostnames $SLURM_JOB_NODELIST\\` listed no '
        'node" >&2',
        "    exit 1",
        "fi",
        "# An exported MASTER_ADDR wins (a site's high-speed interface address, loopback in "
        "tests).",
        'export MASTER_ADDR="${MASTER_ADDR:-${DSENV_HOSTS[0]}}"',
        f"export MASTER_PORT={MASTER_PORT_EXPRESSION}",
        f'DSENV_OUTPUT_DIR={literal(plan.output_dir + "-")}"$SLURM_JOB_ID"',
        'mkdir -p -- "$DSENV_OUTPUT_DIR"',
    ]
    if plan.spec.get("hostfile"):
        # exported: the preflight doctor's launch.ds-hostfile reads the same file
        lines += ['export DSENV_HOSTFILE="$DSENV_OUTPUT_DIR/hostfile"',
                  f"printf '%s slots={plan.ranks_per_node}\\n' \"${{DSENV_HOSTS[@]}}\" "
                  '> "$DSENV_HOSTFILE"']
        if plan.nodes > 1:
            lines += _remote_env_file()
    lines += [
        'echo "dsenv launch: MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT '
        'output $DSENV_OUTPUT_DIR"',
        "",
        "# -- preflight: the doctor on this node, for this launcher and world",
        _array("DSENV_PREFLIGHT", doctor_words(plan)),
        'echo "dsenv launch: preflight: ${DSENV_PREFLIGHT[*]@Q}"',
        '"${DSENV_PREFLIGHT[@]}" || {',
        "    status=$?",
        '    echo "dsenv launch: preflight failed (dsenv doctor exit $status); no rank was '
        'started, the findings are above" >&2',
        '    exit "$status"',
        "}",
        "",
        f"# -- launch: {plan.spec['title']}",
        *([f"# srun --mpi={plan.srun_mpi}: {plan.srun_mpi_origin}"] if plan.srun_mpi_origin
          else []),
        _array("DSENV_LAUNCH", launcher_words(plan)),
        'echo "dsenv launch: ${DSENV_LAUNCH[*]@Q}"',
        "status=0",
        '"${DSENV_LAUNCH[@]}" || status=$?',
        'echo "dsenv launch: launcher exited $status"',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)
