"""``dsenv fetch WORKLOAD --from DIR``: import a bundle that ``dsenv fetch WORKLOAD
--cache-dir DIR`` made on a machine with internet, with no network at all. Every file of
the bundle is checked against its manifest before anything is copied; each area's folder
is copied whole (relative symlinks kept) into a staging folder and renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from dsenv.jsonfiles import write_json_atomically
from dsenv.staging import staged_dir
from dsenv.workloads.errors import FetchError
from dsenv.workloads.fetch.assets import CacheLayout
from dsenv.workloads.fetch.manifest import Output, check_manifest, human_size, load_manifest, now


def import_bundle(bundle: Path, layout: CacheLayout, workloads: list[str], out: Output,
                  every: bool = False) -> int:
    """Copy a bundle's assets into ``layout`` after checking every file; no network.
    ``every`` (``all``): the workloads the bundle holds."""
    source = CacheLayout.under(bundle)
    if not bundle.is_dir():
        raise FetchError(f"--from {bundle}: no such folder; make a bundle on a node with "
                         f"internet with `dsenv fetch WORKLOAD --cache-dir DIR` and copy DIR "
                         f"here (cp -a, rsync -a or tar keep its symlinks)")
    if every:
        present = [w for w in workloads if source.manifest_path(w).is_file()]
        workloads = present or workloads
    manifests = []
    for name in workloads:
        path = source.manifest_path(name)
        if not path.is_file():
            raise FetchError(f"no bundle of {name} in {bundle} (no {path}); make one on a node "
                             f"with internet with `dsenv fetch {name} --cache-dir DIR`, copy "
                             f"DIR here and run `dsenv fetch {name} --from DIR`")
        manifest = load_manifest(path, name)
        checked = check_manifest(source, manifest)
        if checked.problems:
            first = checked.problems[0]
            more = f" (and {len(checked.problems) - 1} more)" if len(checked.problems) > 1 else ""
            raise FetchError(f"bundle {bundle} is damaged, nothing imported: {first.describe()}"
                             f"{more}; copy it again (or make it again with `dsenv fetch {name} "
                             f"--cache-dir DIR`)")
        manifests.append((name, manifest))

    copied: set[tuple[str, str]] = set()
    for name, manifest in manifests:
        out.line(f"dsenv fetch {name} --from {bundle} (made {manifest['created']} from "
                 f"{manifest.get('endpoint', '?')})")
        for entry in manifest["assets"]:
            key = (entry["area"], entry["root"])
            if key not in copied:
                _copy_root(source, layout, entry)
                copied.add(key)
            out.ok(f"{_entry_label(entry)}: {len(entry['files'])} files, "
                   f"{human_size(sum(f['size'] for f in entry['files']))} imported")
        local = dict(manifest, imported_from=str(bundle.resolve()), imported=now())
        path = write_json_atomically(layout.manifest_path(name), local, indent=1)
        out.line(f"manifest {path}")
    return 0


def _copy_root(source: CacheLayout, layout: CacheLayout, entry: dict) -> None:
    src = source.area(entry["area"]) / entry["root"]
    dest = layout.area(entry["area"]) / entry["root"]
    if src.resolve() == dest.resolve():
        return  # importing a layout onto itself
    if not src.is_dir():
        raise FetchError(f"bundle folder {src} is missing; copy the bundle again")
    with staged_dir(dest) as tmp:
        shutil.copytree(src, tmp, symlinks=True, dirs_exist_ok=True)
        inside = tmp.resolve()
        for item in entry["files"]:
            copy = tmp / PurePosixPath(item["path"]).relative_to(entry["root"])
            real = copy.resolve()
            if not real.is_relative_to(inside):
                raise FetchError(f"bundle file {src / copy.relative_to(tmp)} links outside the "
                                 f"bundle ({real}); copy the bundle with its relative symlinks "
                                 f"(cp -a, rsync -a, tar)")
            if not real.is_file() or real.stat().st_size != item["size"]:
                raise FetchError(f"copying {src} to {dest} failed at {item['path']} (size "
                                 f"differs): check the free space there, then run again")


def _entry_label(entry: dict) -> str:
    what = entry["kind"] if entry["area"] == "hub" else "prepared data set"
    return f"{what} {entry['repo']}@{entry['revision']} -> {entry['commit'][:12]}"
