"""Running uv: finding the binary, package-source options, and uv's errors as one line.

Every uv call of dsenv goes through :func:`run_uv` (dsenv.proc underneath, with a timeout),
a build step's through :func:`run_logged`, which first logs the command as the plan shows it
(shown.py); uv's multi-line errors (``error:`` / ``cause:`` chains, resolver trees) are
condensed by :func:`uv_error` into one line that names what failed, with a fix for the
failures that have one (an unreachable index, a hash that does not match the lock).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsenv import proc
from dsenv.envs.stacks import Stack
from dsenv.provision import ProvisionError
from dsenv.provision.shown import Command, Names, log_command

try:
    from uv import find_uv_bin  # the PyPI package ships the binary
except ImportError:  # no uv package: uv on PATH
    find_uv_bin = None

PYPI = "https://pypi.org/simple"

# uv settings that would change what a lock resolves to behind the recorded command's back.
SOURCE_VARIABLES = (
    "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
    "UV_NO_INDEX", "UV_CONSTRAINT", "UV_OVERRIDE", "UV_BUILD_CONSTRAINT", "UV_EXCLUDE_NEWER",
    "UV_PRERELEASE", "UV_RESOLUTION", "UV_TORCH_BACKEND", "UV_INDEX_STRATEGY",
    "UV_PYTHON_PLATFORM",
)


def uv_binary() -> str:
    """The uv executable: the ``uv`` Python package's binary, else ``uv`` on PATH."""
    if find_uv_bin is not None:
        try:
            return find_uv_bin()
        except FileNotFoundError:
            pass
    found = proc.which("uv")
    if found:
        return found
    raise ProvisionError("uv is not installed: `pip install uv` (or `pip install "
                         "'dsenv[provision]'`), then run the command again")


def uv_version() -> str:
    """``uv 0.13.9`` (the first line of ``uv --version``)."""
    result = proc.run([uv_binary(), "--version"], timeout=30)
    if not result.ok:
        raise ProvisionError(f"uv does not run: {result.describe()}: reinstall it with "
                             "`pip install --force-reinstall uv`")
    return result.stdout.strip().split(" (")[0]


@dataclass(frozen=True)
class Sources:
    """Where packages come from: uv's --find-links, --index-url, --extra-index-url, --no-index.

    ``index_url`` None means uv's default (PyPI). Local directories are made absolute so the
    same options work from any working directory.
    """

    find_links: tuple[str, ...] = ()
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False

    @classmethod
    def of(cls, find_links: Iterable[str | os.PathLike] = (), index_url: str | None = None,
           extra_index_urls: Iterable[str] = (), no_index: bool = False) -> Sources:
        links = tuple(_local_or_url(link) for link in find_links)
        return cls(links, index_url, tuple(extra_index_urls), no_index)

    def args(self) -> list[str]:
        out: list[str] = []
        for link in self.find_links:
            out += ["--find-links", link]
        if self.no_index:
            out.append("--no-index")
        else:
            if self.index_url:
                out += ["--index-url", self.index_url]
            for url in self.extra_index_urls:
                out += ["--extra-index-url", url]
        return out

    def indexes(self) -> list[str]:
        """The package indexes asked, in uv's priority order (extra indexes first)."""
        if self.no_index:
            return []
        return [*self.extra_index_urls, self.index_url or PYPI]

    def describe(self) -> str:
        """``index https://pypi.org/simple; find-links /opt/wheels`` for headers and errors."""
        parts = []
        if self.no_index:
            parts.append("no index")
        else:
            parts.append("index " + (self.index_url or PYPI))
            parts += [f"extra index {url}" for url in self.extra_index_urls]
        parts += [f"find-links {link}" for link in self.find_links]
        return "; ".join(parts)


def stack_sources(stack: Stack, find_links: Iterable[str | os.PathLike] | None = None,
                  index_url: str | None = None, no_index: bool = False) -> Sources:
    """Where a stack's packages come from: PyPI (or ``index_url``), plus torch's own index
    (download.pytorch.org/whl/cu126 ...) as an extra index, which uv asks first, unless
    the stack's torch is on PyPI or in a local wheel folder (CI keeps the CPU wheel there)."""
    links = list(find_links or stack.available_find_links())
    torch_index = stack.index_url.rstrip("/")
    primary = (index_url or PYPI).rstrip("/")
    extra = [] if torch_index in (primary, PYPI.rstrip("/"), "") or links else [stack.index_url]
    return Sources.of(links, index_url, extra, no_index)


def _local_or_url(link: str | os.PathLike) -> str:
    text = os.fspath(link)
    if "://" in text:
        return text
    return str(Path(text).expanduser().resolve())


def uv_env(base: Mapping[str, str] | None = None, *, strip_sources: bool = False,
           extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a uv call: plain, uncoloured, unwrapped output; optionally without the UV_*
    variables that would change where packages come from (``strip_sources``)."""
    env = dict(base if base is not None else os.environ)
    if strip_sources:
        for name in SOURCE_VARIABLES:
            env.pop(name, None)
    env["NO_COLOR"] = "1"
    env.pop("FORCE_COLOR", None)
    # uv wraps its error report to COLUMNS when it is set (pytest-xdist's workers set 80):
    # a compiler's error line split in two is one dsenv's one-line summaries cannot quote.
    env.pop("COLUMNS", None)
    env.setdefault("UV_NO_PROGRESS", "1")
    if extra:
        env.update(extra)
    return env


def run_uv(args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
           cwd: str | os.PathLike | None = None,
           output: str | os.PathLike | None = None) -> proc.CommandResult:
    """``uv ARGS`` through dsenv.proc (timeout, whole group killed); never raises itself."""
    return proc.run([uv_binary(), *args], timeout=timeout, env=env if env is not None else uv_env(),
                    cwd=os.fspath(cwd) if cwd is not None else None, output=output)


def uv_command(args: Sequence[str | os.PathLike], env: Mapping[str, str] | None = None,
               cwd: str | os.PathLike | None = None) -> Command:
    """``uv ARGS`` as a :class:`Command` (``env``: the variables set for it, shown)."""
    return Command.of(["uv", *args], env, cwd)


def run_logged(command: Command, *, timeout: float, env: Mapping[str, str] | None = None,
               output: str | os.PathLike | None = None, log: str | os.PathLike | None = None,
               names: Names = ()) -> proc.CommandResult:
    """Run the uv ``command`` (its variables set over ``env``, in its folder), first
    appending it to the build log (``log``, else ``output``) as the plan shows it; ``names``:
    how the caller's temporary folders are shown (shown.temporary_names)."""
    log_command(log if log is not None else output, command, names)
    base = dict(env if env is not None else uv_env())
    return run_uv(command.args, timeout=timeout, env={**base, **command.variables()},
                  cwd=command.cwd, output=output)


def index_unreachable(url: str, timeout: float = 10.0) -> str | None:
    """Why the package index ``url`` did not answer within ``timeout`` seconds, or None when
    it answered (any HTTP status counts: the server is there). A HEAD request (PyPI's
    /simple/ page is tens of MB), through HTTPS_PROXY/HTTP_PROXY as uv would go."""
    request = urllib.request.Request(url.rstrip("/") + "/", method="HEAD",
                                     headers={"User-Agent": "dsenv"})
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # 403/404/405: a server answered
    except urllib.error.URLError as exc:
        reason = exc.reason
        return str(getattr(reason, "strerror", None) or reason)
    except (TimeoutError, OSError) as exc:
        return f"no answer within {timeout:.0f} s" if isinstance(exc, TimeoutError) else str(exc)


# ----------------------------------------------------------------------------- errors
_NETWORK = re.compile(r"Failed to fetch: `?(?P<url>[^\s`]+)`?")
_NETWORK_CAUSES = ("Connection refused", "dns error", "timed out", "Network is unreachable",
                   "No route to host", "failed to lookup address", "Could not connect",
                   "tcp connect error", "error sending request", "certificate")
_HASH = re.compile(r"Hash mismatch for `(?P<pkg>[^`]+)`")
_SHA = re.compile(r"(sha256|sha384|sha512|md5):([0-9a-f]+)")
_BOX = re.compile(r"^[\s×╰─▶│├]+")


def uv_message_lines(text: str) -> list[str]:
    """uv's ``error:`` / ``cause:`` / resolver lines, stripped of prefixes and box drawing."""
    lines = []
    for raw in text.splitlines():
        line = _BOX.sub("", raw).strip()
        if not line or line.startswith(("Using Python", "Resolved ", "Prepared ", "Audited ",
                                        "Installed ", "Uninstalled ", "Checked ", "Bytecode ",
                                        "DEBUG", "warning:", "hint:", " +", " -", " ~")):
            continue
        for prefix in ("error: ", "cause: ", "Caused by: "):
            if line.startswith(prefix):
                line = line[len(prefix):]
        lines.append(line)
    return lines


def unreachable_index(text: str) -> tuple[str, str] | None:
    """(URL that could not be fetched, the network cause) when uv failed on the network."""
    match = _NETWORK.search(text)
    if not match:
        return None
    causes = [line for line in uv_message_lines(text)
              if any(key.lower() in line.lower() for key in _NETWORK_CAUSES)]
    if not causes:
        return None
    return match.group("url"), causes[-1]


def index_of(url: str, sources: Sources) -> str:
    """The configured index (or find-links URL) that ``url`` was fetched from."""
    for base in [*sources.indexes(), *sources.find_links]:
        if url.startswith(base.rstrip("/")):
            return base
    return url


def hash_mismatch(text: str) -> tuple[str, str, str] | None:
    """(package==version, expected hash, computed hash) when uv refused a download."""
    match = _HASH.search(text)
    if not match:
        return None
    tail = text[match.end():]
    hashes = [f"{algo}:{digest}" for algo, digest in _SHA.findall(tail)]
    expected = hashes[0] if hashes else "?"
    computed = hashes[-1] if len(hashes) > 1 else "?"
    return match.group("pkg"), expected, computed


def uv_error(result: proc.CommandResult, what: str, limit: int = 400) -> str:
    """One line for a failed uv call: ``WHAT: uv's error chain`` (timeouts, missing uv too)."""
    if result.timed_out:
        return f"{what}: uv did not finish within {result.seconds:.0f} s (killed)"
    if result.not_found:
        return f"{what}: uv not found ({result.argv[0]}): `pip install uv`"
    lines = uv_message_lines(result.stderr or result.stdout)
    chain = ": ".join(dict.fromkeys(lines)) or f"uv exited {result.returncode}"
    if len(chain) > limit:
        chain = chain[: limit - 3] + "..."
    return f"{what}: {chain}"
