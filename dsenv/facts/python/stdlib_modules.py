"""Which compiled standard-library modules the job's interpreter can import, and the OpenSSL
its ssl module is linked to.

A Python built from source (pyenv, asdf, a site's hand-built module) skips every extension
whose library headers the build host lacked, and says so only at the end of `make`; the
interpreter runs until something imports the module (datasets' ``lzma``, pip's ``ssl``). The
modules (envs/stdlib_extensions.toml) are imported in the job's own interpreter, one child, and
its answer is the fact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dsenv.data import load_table
from dsenv.facts.node import Node, probe
from dsenv.facts.python import target_env
from dsenv.facts.python.pyenv import find_distribution

# Run in the job's interpreter: each module alone (one failing does not hide the others), then
# ssl's OpenSSL. Prints one JSON line.
SCRIPT = """
import importlib, json, sys
missing = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing[name] = f"{type(exc).__name__}: {exc}"
try:
    import ssl
    openssl = [ssl.OPENSSL_VERSION, list(ssl.OPENSSL_VERSION_INFO)]
except Exception:
    openssl = None
print(json.dumps({"missing": missing, "openssl": openssl, "python": sys.version.split()[0]}))
"""


def modules() -> list[dict]:
    return load_table("dsenv.envs", "stdlib_extensions.toml")["module"]


@dataclass(frozen=True)
class StdlibModules:
    python: str | None  # the interpreter asked (None: the environment has none that runs here)
    asked: bool = False
    not_asked: str = ""  # why it was not, when it was not
    version: str = ""  # that interpreter's Python version
    missing: dict = field(default_factory=dict)  # module -> the interpreter's ImportError line
    openssl: str | None = None  # ssl.OPENSSL_VERSION (None: no ssl module)
    openssl_info: tuple = ()  # ssl.OPENSSL_VERSION_INFO
    urllib3: str | None = None  # the installed urllib3 (None: not installed)


@probe
def stdlib_modules(node: Node) -> StdlibModules:
    env = target_env.environment(node)
    dist = find_distribution("urllib3", list(env.path))
    urllib3 = dist.version if dist is not None else None
    if env.python is None:
        return StdlibModules(None, not_asked="the environment has no interpreter that runs here",
                             urllib3=urllib3)
    names = [m["name"] for m in modules()]
    # as the job runs it: its PYTHONHOME and PYTHONPATH apply
    result = node.run([env.python, "-c", SCRIPT, *names])
    if not result.ok:
        tail = (result.stderr or "").strip().splitlines()
        why = result.describe() + (f": {tail[-1]}" if tail else "")
        return StdlibModules(env.python, not_asked=why, urllib3=urllib3)
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return StdlibModules(env.python, not_asked="the interpreter printed no answer",
                             urllib3=urllib3)
    openssl = answer.get("openssl")
    return StdlibModules(env.python, asked=True, version=answer.get("python", ""),
                         missing=dict(answer.get("missing") or {}),
                         openssl=openssl[0] if openssl else None,
                         openssl_info=tuple(openssl[1]) if openssl else (), urllib3=urllib3)
