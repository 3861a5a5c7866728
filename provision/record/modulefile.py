"""The environment as an Lmod module: ``DIR/NAME/VERSION.lua`` (``dsenv provision
--modulefile DIR``, or the site profile's ``modulefiles``).

It sets what the activate script sets: both render the one list of settings.py (PATH, the
prefix variable and DSENV_ENV, TORCH_EXTENSIONS_DIR, the arch variables, HF offline inside
Slurm jobs, the site's NCCL/... variables, the site's modules as ``depends_on``), plus
DSENV_MODULE, its own name. Lmod reverses every line on ``module unload``: ``prepend_path``
is removed, ``pushenv`` restores the value from before the load (or unsets it), a variable
the user had already set is left alone both ways (``setenv(NAME, VALUE, true)``), and
``depends_on`` modules go again unless another module needs them (a site's ``module swap A
B`` unloads A and depends on B: unloading gives B back, not A). An Open MPI that
``dsenv provision openmpi --env PREFIX`` built is added as one block (its MODULEPATH and a
``depends_on``), replaced on every record, as in the activate script.

Name and version: ``dsenv-<stack>/<first 8 hex of the lock's sha256>``, with the GPU archs
appended for a GPU target (``dsenv-cuda12.6/1a2b3c4d-sm80``): one lock built for two
archs gives two modules. ``--module-name NAME/VERSION`` chooses another. Lmod reads Lua only
(Environment Modules' Tcl is not written).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsenv import __version__
from dsenv.envs.targets import Target
from dsenv.provision import ProvisionError
from dsenv.provision.record.settings import (
    Group,
    Module,
    Prepend,
    Rehash,
    Setting,
    SetVar,
    SourceHooks,
    Unset,
    expansions,
)

OFF = ("none", "off", "no")
BLOCK_BEGIN = "-- >>> dsenv provision openmpi >>>"
BLOCK_END = "-- <<< dsenv provision openmpi <<<"
MANIFEST_KEY = "modulefile"  # the manifest's record: {"path", "module", "root"}
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
# The variable DSENV_ENV names the environment; the marker line names the prefix for the
# check that refuses to overwrite another environment's modulefile.
_PREFIX_LINE = re.compile(r'^pushenv\("DSENV_ENV", (".*")\)$', re.MULTILINE)


@dataclass(frozen=True)
class ModulefilePlan:
    """Where the modulefile goes: ``root/name/version.lua``; ``version`` "" until the lock's
    hash is known (a lock made on site)."""

    root: Path
    name: str
    version: str
    source: str  # "--modulefile", "site NAME"
    fixed: bool = False  # --module-name gave name and version

    @property
    def module(self) -> str:
        return f"{self.name}/{self.version or '<lock hash>'}"

    @property
    def path(self) -> Path:
        return self.root / self.name / f"{self.version or '<lock hash>'}.lua"

    def with_lock(self, sha256: str, target: Target) -> ModulefilePlan:
        if self.fixed:
            return self
        return ModulefilePlan(self.root, self.name, default_version(sha256, target),
                              self.source, False)


def default_version(sha256: str, target: Target) -> str:
    """``1a2b3c4d`` (the lock's hash), ``1a2b3c4d-sm80-sm90`` / ``...-gfx90a`` for GPUs."""
    archs = [("sm" + a.replace(".", "")) if target.vendor == "nvidia" else a
             for a in target.archs] if target.is_gpu else []
    return "-".join([sha256[:8], *archs])


def plan_modulefile(value: str | None, name: str | None, site_value: str, site_name: str,
                    stack: str, lock_sha256: str, target: Target,
                    env: dict | None = None) -> ModulefilePlan | None:
    """``--modulefile DIR`` > the site's ``modulefiles`` (``none`` turns it off); None when
    neither asks. ``name``: ``--module-name NAME/VERSION``."""
    env = os.environ if env is None else env
    for given, source in ((value, "--modulefile"), (site_value, f"site {site_name}")):
        if not given:
            continue
        if given.strip().lower() in OFF:
            return None
        expanded = re.sub(r"\$(\w+|\{(\w+)\})",
                          lambda m: env.get(m.group(2) or m.group(1), m.group(0)),
                          given.strip())
        expanded = os.path.expanduser(expanded)
        if "$" in expanded:
            raise ProvisionError(f"modulefiles folder {given!r} ({source}): {expanded} still "
                                 "holds an unset variable: set it, or pass --modulefile DIR")
        root = Path(expanded).absolute()
        if name:
            parts = name.split("/")
            if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
                raise ProvisionError(f"--module-name {name!r}: give NAME/VERSION (letters, "
                                     "digits, . _ + -), e.g. deepspeed/0.18-cpu")
            return ModulefilePlan(root, parts[0], parts[1], source, fixed=True)
        version = default_version(lock_sha256, target) if lock_sha256 else ""
        return ModulefilePlan(root, f"dsenv-{stack}", version, source)
    return None


def check_modulefile(plan: ModulefilePlan, prefix: Path, force: bool) -> None:
    """Refuse to overwrite the modulefile of another environment (without --force), and a
    folder that cannot be written."""
    path = plan.path
    if plan.version and path.is_file() and not force:
        other = modulefile_prefix(path.read_text(errors="replace"))
        if other and other != str(prefix):
            raise ProvisionError(
                f"modulefile {path} exists and loads another environment ({other}): pass "
                "--module-name NAME/VERSION for this one, or --force to replace it")
    folder = next((p for p in [path.parent, *path.parents] if p.exists()), None)
    if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ProvisionError(f"modulefile {path}: {folder or path.parent} cannot be written "
                             "here: pass --modulefile DIR with a folder you can write")


def modulefile_prefix(text: str) -> str:
    """The environment prefix a dsenv modulefile loads ("" when it names none)."""
    match = _PREFIX_LINE.search(text)
    if not match:
        return ""
    return _unquote(match.group(1))


def _unquote(literal: str) -> str:
    out, i, body = [], 0, literal[1:-1]
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt.isdigit():
                digits = re.match(r"\d{1,3}", body[i + 1:]).group()
                out.append(chr(int(digits)))
                i += 1 + len(digits)
                continue
            out.append({"n": "\n", "r": "\r", "t": "\t"}.get(nxt, nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


# -- rendering ---------------------------------------------------------------------------
def lua_str(text: str) -> str:
    """``text`` as a Lua string literal: quotes, backslashes and control characters escaped
    (a value can never end the string or run code)."""
    out = []
    for char in str(text):
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif ord(char) < 32 or ord(char) == 127:
            out.append(f"\\{ord(char):03d}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


_EXPAND_FUNCTION = """\
-- ${NAME}, ${NAME:-default}, ${NAME:+word}... of the site profile, as sh expands them
local function dsenv_expand(name, op, word)
   local value = os.getenv(name)
   if op == "" then return value or "" end
   local set = value ~= nil and (op:sub(1, 1) ~= ":" or value ~= "")
   if op:sub(-1) == "+" then
      if set then return word end
      return ""
   end
   if set then return value end
   return word
end
"""


def _lua_value(setting: SetVar) -> str:
    if not setting.expand:
        return lua_str(setting.value)
    parts = []
    for literal, expansion in expansions(setting.value):
        if literal:
            parts.append(lua_str(literal))
        if expansion:
            name, operator, word = expansion
            parts.append(f"dsenv_expand({lua_str(name)}, {lua_str(operator)}, "
                         f"{lua_str(word)})")
    return " .. ".join(parts) or '""'


def _lua(setting: Setting) -> list[str]:
    if isinstance(setting, Module):
        verb, *names = setting.words
        quoted = ", ".join(lua_str(n) for n in names)
        if verb in ("load", "try-load"):
            return [f"depends_on({lua_str(n)})" for n in names if not n.startswith("-")]
        if verb in ("swap", "switch") and len(names) == 2:
            # Lmod has no swap() in modulefiles: the old one goes, the new one is a
            # dependency (unloading this module unloads it, but does not bring the old back)
            old, new = (lua_str(n) for n in names)
            return [f"if isloaded({old}) then unload({old}) end", f"depends_on({new})"]
        if verb == "unload":
            return [f"unload({quoted})"]
        if verb == "use":
            return [f"prepend_path(\"MODULEPATH\", {lua_str(n)})" for n in names
                    if not n.startswith("-")]
        return [f"-- `module {' '.join(setting.words)}`: not done by a modulefile"]
    if isinstance(setting, SetVar):
        if setting.keep:  # set only when unset; unset on unload only when still ours
            return [f"setenv({lua_str(setting.name)}, {_lua_value(setting)}, true)"]
        return [f"pushenv({lua_str(setting.name)}, {_lua_value(setting)})"]
    if isinstance(setting, Prepend):
        return [f"prepend_path({lua_str(setting.name)}, {lua_str(setting.path)})"]
    if isinstance(setting, Unset):
        return [f"pushenv({lua_str(setting.name)}, false)"]
    if isinstance(setting, Rehash):
        return []
    if isinstance(setting, SourceHooks):
        folder = lua_str(setting.folder)
        return [f"if isDir({folder}) then",
                "   local hooks = {}",
                f"   for file in lfs.dir({folder}) do",
                '      if file:match("%.sh$") then hooks[#hooks + 1] = file end',
                "   end",
                "   table.sort(hooks)",
                "   for _, file in ipairs(hooks) do",
                "      -- quoted: Lmod puts the path into a shell command as it is",
                f"      local path = pathJoin({folder}, file)",
                """      source_sh("bash", "'" .. (path:gsub("'", "'\\\\''")) .. "'")""",
                "   end",
                "end"]
    raise ProvisionError(f"modulefile: unknown setting {setting!r}")


def lua_lines(groups: list[Group]) -> list[str]:
    """The settings (settings.py) as Lmod Lua, each group followed by a blank line."""
    lines: list[str] = []
    if any(isinstance(s, SetVar) and s.expand and "$" in s.value
           for group in groups for s in group.settings):
        lines += _EXPAND_FUNCTION.splitlines() + [""]
    for group in groups:
        lines += [f"-- {line}" for line in group.comment]
        indent = ""
        if group.in_slurm_job:
            lines.append('if (os.getenv("SLURM_JOB_ID") or "") ~= "" then')
            indent = "   "
        for setting in group.settings:
            if getattr(setting, "note", ""):
                lines.append(f"{indent}-- {setting.note}")
            lines += [indent + line for line in _lua(setting)]
        if group.in_slurm_job:
            lines.append("end")
        lines.append("")
    return lines


def render_modulefile(groups: list[Group], *, module: str, prefix: Path, about: dict,
                      openmpi: dict | None = None) -> str:
    """The modulefile's text. ``about``: what help and whatis say (site, stack, torch,
    deepspeed, archs, lock, lock_sha256, ops); ``openmpi``: the manifest's
    ``openmpi_module`` record (its block), or None."""
    lines = [f"-- dsenv environment {prefix}: module {module}",
             f"-- Written by dsenv {__version__} (`dsenv provision ... --modulefile DIR`); it "
             "sets what the environment's",
             "-- activate script sets (both from one description) and Lmod undoes it on "
             "`module unload`.",
             "-- `dsenv provision ... --force` rewrites this file. It holds no credentials.",
             ""]
    facts = [("Stack", f"{about.get('stack')} ({about.get('torch') or 'torch ?'})"),
             ("DeepSpeed", about.get("deepspeed") or "?"),
             ("Archs", about.get("archs") or "?"),
             ("Lock", f"{about.get('lock')} sha256 {about.get('lock_sha256')}"),
             ("Ops", about.get("ops") or "none precompiled"),
             ("Site", about.get("site") or "?"),
             ("Prefix", str(prefix))]
    help_text = "\n".join(
        [f"DeepSpeed environment provisioned by dsenv: {prefix}", "",
         *[f"  {key + ':':11}{value}" for key, value in facts], "",
         "Loading it sets what `. PREFIX/activate` sets: PATH, the environment's "
         "variables,",
         "TORCH_EXTENSIONS_DIR, the arch variables, the site's offline and NCCL variables;",
         "unloading takes them back. Check the environment with `dsenv doctor`."])
    lines += [f"help({lua_str(help_text)})", "",
              'whatis("Name: DeepSpeed environment (dsenv)")',
              f"whatis({lua_str('Version: ' + module.split('/', 1)[-1])})",
              *[f"whatis({lua_str(f'{key}: {value}')})" for key, value in facts], ""]
    lines += lua_lines(groups)
    lines += ["-- This module's own name, for `dsenv doctor`'s report.",
              f"pushenv(\"DSENV_MODULE\", {lua_str(module)})", ""]
    text = "\n".join(lines)
    if openmpi:
        text = with_block(text, openmpi_block(openmpi))
    return text


def openmpi_block(record: dict) -> str:
    """The lines that make the module load the Open MPI dsenv built (replaced on every
    record): its MODULEPATH, then ``depends_on`` it."""
    return "\n".join([BLOCK_BEGIN,
                      f"-- Open MPI for Slurm + PMIx built by EasyBuild (`dsenv provision "
                      f"openmpi`): {record['module']}.",
                      f"prepend_path(\"MODULEPATH\", {lua_str(record['modulepath'])})",
                      f"depends_on({lua_str(record['module'])})",
                      BLOCK_END]) + "\n"


def with_block(text: str, block: str) -> str:
    """``text`` with its Open MPI block replaced by ``block`` (appended when absent)."""
    pattern = re.compile(re.escape(BLOCK_BEGIN) + r".*?" + re.escape(BLOCK_END) + r"\n?",
                         re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + "\n\n" + block


def describe_ops(ops: dict) -> str:
    installed = ops.get("installed") or []
    if installed:
        return f"{', '.join(installed)} precompiled (--ops {ops.get('mode')})"
    return f"none precompiled (--ops {ops.get('mode')}): they JIT-compile on first use"


def about_manifest(manifest) -> dict:
    """help/whatis facts from an :class:`~dsenv.provision.record.manifest.EnvManifest`."""
    target = Target.from_json(manifest.target)
    return {"site": manifest.site, "stack": manifest.stack, "torch": manifest.torch,
            "deepspeed": (manifest.versions or {}).get("deepspeed"),
            "archs": target.describe(), "lock": manifest.lock.get("file"),
            "lock_sha256": manifest.lock.get("sha256"), "ops": describe_ops(manifest.ops)}


# -- writing -----------------------------------------------------------------------------
def stage_modulefile(path: Path, text: str) -> Path:
    """``text`` in a hidden temporary file beside ``path`` (Lmod ignores it); rename it with
    :func:`os.replace` once the environment is in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)
