"""python.stdlib-extensions: the compiled standard-library modules of the job's interpreter
(a Python built from source without a library's headers lacks them), and the OpenSSL its ssl
module is linked to against the installed urllib3."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.python import stdlib_modules
from dsenv.verdicts.findings import fail, ok, skip, warn

# urllib3 2.0 refuses an ssl module linked to OpenSSL older than 1.1.1 at import
# (https://github.com/urllib3/urllib3/issues/2168)
URLLIB3_MIN_OPENSSL = (1, 1, 1)


def urllib3_refuses(openssl_info: tuple, urllib3: str | None) -> bool:
    """urllib3 >= 2 beside an ssl module linked to OpenSSL < 1.1.1 (a Python built on
    RHEL/CentOS 7's OpenSSL 1.0.2): importing urllib3, hence requests and the Hub, fails."""
    if not openssl_info or urllib3 is None:
        return False
    try:
        major = Version(urllib3).major
    except InvalidVersion:
        return False
    return major >= 2 and tuple(openssl_info[:3]) < URLLIB3_MIN_OPENSSL


@check("python.stdlib-extensions", "Standard-library extension modules")
def stdlib_extensions(ctx: Context):
    found = stdlib_modules.stdlib_modules(ctx)
    if not found.asked:
        return skip(f"the job's interpreter was not asked ({found.not_asked})")
    table = {m["name"]: m for m in stdlib_modules.modules()}
    evidence = [f"{found.python} (Python {found.version}): {name} -> {error}"
                for name, error in found.missing.items()]
    if found.missing:
        rows = [table[name] for name in found.missing if name in table]
        # a module that exists but cannot load (libssl.so.1.1 gone) is not a build without it
        absent = [m for m in rows if "No module named" in found.missing[m["name"]]]
        broken = [m for m in rows if m not in absent]
        if absent:
            verdict = fail if any(m["severity"] == "fail" for m in absent) else warn
            names = ", ".join(f"{m['name']} ({m['imports']}: {m['needed_by']})" for m in absent)
            apt = " ".join(m["apt"] for m in absent)
            yum = " ".join(m["yum"] for m in absent)
            return mode_finding(
                verdict, "env.python-built-without-stdlib-ext",
                f"the job's Python {found.version} was built without {names}", *evidence,
                here=f"install the headers ({apt} on Debian/Ubuntu; {yum} on RHEL) and rebuild "
                     f"{found.python}'s Python, or use a prebuilt one (conda, `uv python install`)")
        if broken:
            names = ", ".join(m["name"] for m in broken)
            return fail(f"the job's Python {found.version} has {names} but cannot load it",
                        "make the library the module links to loadable in the job (the error "
                        "names it), or reinstall that Python", *evidence)
    if urllib3_refuses(found.openssl_info, found.urllib3):
        return mode_finding(
            fail, "env.urllib3-needs-openssl-111",
            f"urllib3 {found.urllib3} refuses this Python's ssl module ({found.openssl}): "
            "requests, pip and the Hub downloads fail at import",
            f"{found.python}: ssl linked to {found.openssl}", f"urllib3 {found.urllib3}",
            here="pip install 'urllib3<2' in the job's environment, or a Python linked to "
                 "OpenSSL >= 1.1.1")
    return ok(f"Python {found.version} imports {', '.join(table)}",
              f"ssl: {found.openssl or 'not importable'}; urllib3 {found.urllib3 or 'not installed'}")
