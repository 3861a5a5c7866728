"""``python -m dsenv.provision.conda.rattler`` < job.json: link checked local conda archives
into a prefix with py-rattler, in a subprocess of its own (rattler's interpreter sometimes
crashes at exit); one marked JSON line out, read by conda_install.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from dsenv.provision.conda.recipe import RATTLER_MARK


def main() -> None:
    """Link the job's checked local archives into its prefix; one JSON line out; ends with
    os._exit."""
    code = 1
    try:
        from rattler import LockFile, Subdir, install  # rattler: only this subprocess needs it

        job = json.loads(sys.stdin.read())
        lock = LockFile.from_path(job["lockfile"])
        environment = lock.default_environment()
        if environment is None:
            raise RuntimeError("the lock file has no default environment")
        platform = next((p for p in environment.platforms() if p.name == job["platform"]),
                        None)
        if platform is None:
            raise RuntimeError(f"the lock file has no {job['platform']} packages")
        files = job["files"]
        by_name = {url.rsplit("/", 1)[-1]: path for url, path in files.items()}
        records = []
        for record in environment.conda_repodata_records_for_platform(platform) or []:
            path = files.get(record.url) or by_name.get(record.file_name)
            if path is None:
                continue  # not selected (an optional category)
            record.url = Path(path).as_uri()
            records.append(record)
        if len(records) != len(files):
            found = {r.file_name for r in records}
            lost = sorted(set(by_name) - found)
            raise RuntimeError(f"rattler did not find {', '.join(lost)} in the lock file")
        asyncio.run(install(
            records, target_prefix=job["prefix"], cache_dir=Path(job["extract_dir"]),
            platform=Subdir(job["platform"]), show_progress=False,
            execute_link_scripts=False, alternative_target_prefix=job["final_prefix"]))
        print(RATTLER_MARK + json.dumps({"ok": True,
                                        "installed": sorted(r.file_name for r in records)}))
        code = 0
    except BaseException as exc:  # the parent reads the reason from the JSON line
        print(RATTLER_MARK + json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
