"""An Open MPI build for EasyBuild: the names eb will use (EasyBuild's default module naming
scheme), the easyconfig (plain EasyBuild syntax), the eb command, and the plan that
``--dry-run`` prints."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dsenv.provision.openmpi.options import Lmod, Pmix, Source, Toolchain, table
from dsenv.provision.shown import LOG_MARK, Command

WORK_DIR = "dsenv"  # inside --installpath: the generated easyconfigs and eb's output
MODULES_SUBDIR = ("modules", "all")  # EasyBuild's default module install path and suffix
EASYCONFIG_BEGIN = "----- easyconfig {path} -----"
EASYCONFIG_END = "----- end of easyconfig -----"


@dataclass
class OpenMpiBuild:
    version: str
    series: dict
    toolchain: Toolchain
    pmix: Pmix
    sources: list[Source]
    source: Source
    source_found: Path | None
    sourcepaths: list[Path]
    installpath: Path
    eb: str | None
    modules_tool: Lmod | None
    env_prefix: Path | None = None
    jobs: int | None = None
    robot: bool = False
    robot_paths: str = ""
    rebuild: bool = False
    timeout_min: float = 240.0
    notes: list[str] = field(default_factory=list)

    # -- names EasyBuild will use (default module naming scheme) --
    @property
    def versionsuffix(self) -> str:
        return table()["versionsuffix"]

    @property
    def module_version(self) -> str:
        return f"{self.version}{self.toolchain.module_part()}{self.versionsuffix}"

    @property
    def module_name(self) -> str:
        return f"{table()['name']}/{self.module_version}"

    @property
    def modulepath(self) -> Path:
        return self.installpath.joinpath(*MODULES_SUBDIR)

    def module_files(self) -> list[Path]:
        """The module file eb writes: .lua for Lmod, no extension for Tcl modules tools."""
        base = self.modulepath / self.module_name
        return [base.with_name(base.name + ".lua"), base]

    @property
    def software_dir(self) -> Path:
        return self.installpath / "software" / table()["name"] / self.module_version

    @property
    def easyconfig_path(self) -> Path:
        return self.installpath / WORK_DIR / f"{self.module_name.replace('/', '-')}.eb"

    @property
    def log_path(self) -> Path:
        return self.easyconfig_path.with_suffix(".log")

    # -- what goes into the easyconfig --
    def configopts(self) -> list[str]:
        return [*self.series["configopts"], *self.toolchain.configopts, *self.pmix.configopts]

    def sanity_commands(self) -> list[str]:
        return [*self.series["sanity_commands"], self.series["pmix_check"][self.pmix.check]]

    def easyconfig(self) -> str:
        data = table()
        lines = [
            f"# Written by `dsenv provision openmpi`: Open MPI {self.version} that Slurm can "
            "launch directly",
            "# (srun --mpi=pmix) and whose mpirun reads the allocation.",
            f"# PMIx: {self.pmix.describe()}",
            "",
            f"easyblock = {data['easyblock']!r}",
            "",
            f"name = {data['name']!r}",
            f"version = {self.version!r}",
            f"versionsuffix = {self.versionsuffix!r}",
            "",
            f"homepage = {data['homepage']!r}",
            f"description = {data['description']!r}",
            "",
            f"toolchain = {self.toolchain.easyconfig()}",
            "",
            f"source_urls = {list(self.source.urls)!r}",
            f"sources = [{self.source.file!r}]",
            f"checksums = [{{{self.source.file!r}: {self.source.sha256!r}}}]",
            "",
        ]
        if self.pmix.dependency:
            lines += [f"dependencies = [{self.pmix.dependency!r}]", ""]
        lines += [f"configopts = {' '.join(self.configopts())!r}", "",
                  "sanity_check_paths = {",
                  f"    'files': {list(self.series['sanity_files'])!r},",
                  "    'dirs': [],",
                  "}",
                  "sanity_check_commands = ["]
        lines += [f"    {command!r}," for command in self.sanity_commands()]
        lines += ["]", "", f"moduleclass = {data['moduleclass']!r}", ""]
        return "\n".join(lines)

    # -- the eb run --
    def eb_env(self) -> dict[str, str]:
        """The variables dsenv sets for eb (on top of the caller's environment)."""
        env = {}
        if self.modules_tool and self.modules_tool.command:
            env["EASYBUILD_MODULES_TOOL"] = "Lmod"
            env["LMOD_CMD"] = self.modules_tool.command
        return env

    def eb_command(self) -> list[str]:
        command = [self.eb or "eb", str(self.easyconfig_path),
                   f"--installpath={self.installpath}"]
        if self.sourcepaths:
            command.append("--sourcepath=" + os.pathsep.join(map(str, self.sourcepaths)))
        if self.robot:
            command.append("--robot")
        if self.robot_paths:
            command.append(f"--robot-paths={self.robot_paths}")
        if self.jobs:
            command.append(f"--parallel={self.jobs}")
        if self.rebuild:
            command.append("--rebuild")
        return command

    def eb_run(self) -> Command:
        """eb as the dry run prints it and the run logs it before running it."""
        return Command.of(self.eb_command(), self.eb_env())

    def module_lines(self) -> list[str]:
        return [f"module use {shlex.quote(str(self.modulepath))}",
                f"module load {self.module_name}"]

    def header(self) -> list[str]:
        where = (f"found at {self.source_found}" if self.source_found else
                 "not in the source path: eb downloads it from "
                 + ", ".join(self.source.urls))
        tool = self.modules_tool
        lines = [f"dsenv provision openmpi: Open MPI {self.version} for Slurm + PMIx, built by "
                 "EasyBuild",
                 f"  module     {self.module_name} (module use {self.modulepath})",
                 f"  toolchain  {self.toolchain.describe()}",
                 f"  pmix       {self.pmix.describe()}",
                 f"  source     {self.source.file} {where}",
                 f"  eb         {self.eb or 'not found'}; modules tool "
                 + (f"{tool.tool} {tool.command}".rstrip() if tool else "not found")]
        if self.env_prefix:
            lines.append(f"  env        {self.env_prefix} (activate and manifest get the "
                         "module lines)")
        lines += [f"  note       {note}" for note in self.notes]
        return lines

    def render(self) -> str:
        return "\n".join([
            *self.header(), "",
            EASYCONFIG_BEGIN.format(path=self.easyconfig_path),
            self.easyconfig().rstrip("\n"),
            EASYCONFIG_END, "",
            f"eb command (output to {self.log_path}, timeout {self.timeout_min:g} min):",
            LOG_MARK + self.eb_run().render(), "",
            "then: " + "; ".join(self.module_lines())])
