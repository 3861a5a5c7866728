"""A micromamba-compatible command backed by py-rattler, for tests only.

It answers exactly what conda-lock 4 asks a micromamba for when it locks:

    micromamba --version
    micromamba create --prefix P --dry-run --json [--override-channels] --channel URL ... SPEC ...

The solve is rattler's (the same solver pixi uses) against the given channels for the
platform in ``CONDA_SUBDIR`` (plus noarch), with the virtual packages conda-lock announces
through ``CONDA_OVERRIDE_*``; the answer is micromamba's dry-run JSON (``actions.FETCH`` /
``actions.LINK`` records with url, md5 and sha256). Anything else exits 2 saying so. The
process ends with ``os._exit`` (rattler's interpreter sometimes crashes at exit).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback

VERSION = "2.3.0"
CHANNEL_OPTIONS = ("-c", "--channel")
VALUE_OPTIONS = ("-p", "--prefix", "-n", "--name", "-r", "--root-prefix", "--rc-file")
FLAG_OPTIONS = ("--dry-run", "--json", "--override-channels", "-y", "--yes", "-q", "--quiet",
                "--no-pip", "--offline", "--strict-channel-priority")


def _virtual_packages(platform: str) -> list:
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version

    found = []
    overrides = {
        "__glibc": os.environ.get("CONDA_OVERRIDE_GLIBC"),
        "__linux": os.environ.get("CONDA_OVERRIDE_LINUX"),
        "__cuda": os.environ.get("CONDA_OVERRIDE_CUDA"),
    }
    if platform.startswith("linux"):
        found.append(("__unix", "0", "0"))
        for name, value in overrides.items():
            if value:
                found.append((name, value, "0"))
    archspec = os.environ.get("CONDA_OVERRIDE_ARCHSPEC")
    if archspec:
        found.append(("__archspec", "1", archspec))
    return [GenericVirtualPackage(PackageName(n), Version(v), BuildString(b))
            for n, v, b in found]


def _record_json(record) -> dict:
    data = json.loads(record.to_json())
    data.update(
        url=record.url,
        fn=record.file_name,
        channel=record.channel,
        build_string=str(record.build),
    )
    return data


async def _solve(channels: list[str], specs: list[str], platform: str) -> list[dict]:
    from rattler import Channel, solve

    records = await solve(
        sources=[Channel(url) for url in channels],
        specs=specs,
        platforms=[platform, "noarch"],
        virtual_packages=_virtual_packages(platform),
        channel_relations="disabled",
    )
    return [_record_json(r) for r in records]


def main(argv: list[str]) -> int:
    if argv in (["--version"], ["-V"]):
        print(VERSION)
        return 0
    if not argv or argv[0] != "create":
        print(f"condashim (tests): unsupported command {' '.join(argv)!r}", file=sys.stderr)
        return 2
    channels, specs, prefix, dry_run = [], [], None, False
    args = iter(argv[1:])
    for arg in args:
        if arg in CHANNEL_OPTIONS:
            channels.append(next(args))
        elif arg in ("-p", "--prefix"):
            prefix = next(args)
        elif arg in VALUE_OPTIONS:
            next(args)
        elif arg == "--dry-run":
            dry_run = True
        elif arg in FLAG_OPTIONS:
            pass
        elif arg.startswith("-"):
            print(f"condashim (tests): unsupported option {arg}", file=sys.stderr)
            return 2
        else:
            specs.append(arg)
    if not dry_run:
        print("condashim (tests): only `create --dry-run --json` is supported", file=sys.stderr)
        return 2
    platform = os.environ.get("CONDA_SUBDIR", "linux-64")
    try:
        fetch = asyncio.run(_solve(channels, specs, platform))
    except Exception as exc:  # the solver's message is what conda-lock should show
        print(json.dumps({"success": False, "message": str(exc)}))
        return 1
    link = [{k: r[k] for k in ("name", "version", "build", "build_number", "channel",
                               "fn", "url")} | {"dist_name": r["fn"].rsplit(".tar.bz2", 1)[0]
                                                .rsplit(".conda", 1)[0]} for r in fetch]
    print(json.dumps({
        "success": True, "dry_run": True, "prefix": prefix,
        "actions": {"FETCH": fetch, "LINK": link, "PREFIX": prefix},
    }, indent=1))
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
