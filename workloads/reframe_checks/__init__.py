"""dsenv's ReFrame checks, shipped inside the package: ``dsenv reframe --path`` prints where
they are, for ``reframe -C SITE_CONFIG -c "$(dsenv reframe --path)" -r``.

The checks themselves are in :mod:`dsenv_checks` (this folder): ReFrame loads that file, so it
imports reframe; nothing here does, and ``dsenv`` never imports the checks.

    checks_path()               the checks file
    add_reframe_parser(sub)     adds "reframe" to dsenv's sub-commands
    run_reframe(args) -> int    prints the path (--path) or how to run them
"""

from __future__ import annotations

from pathlib import Path

CHECKS_FILE = "dsenv_checks.py"
# The checks it defines (dsenv_checks.py), for the how-to `dsenv reframe` prints.
CHECK_CLASSES = {
    "DsenvDoctor": "the doctor as a preflight: sanity is its verdict",
    "DsenvNodeHealth": "`dsenv doctor --node-health` on every node of the job",
    "DsenvSmoke": "each workload's smoke, by %workload, %preset and %launcher",
    "DsenvRun": "each workload's full run, after the DsenvFetch fixture (`dsenv fetch`)",
    "DsenvDistributed": "`dsenv doctor --distributed`, busbw as a performance variable",
}


def checks_path() -> Path:
    """The checks file, wherever dsenv is installed (a wheel or an editable checkout)."""
    return Path(__file__).resolve().with_name(CHECKS_FILE)


def add_reframe_parser(subparsers) -> None:
    reframe = subparsers.add_parser(
        "reframe", help="where dsenv's ReFrame checks are (reframe -c \"$(dsenv reframe "
                        "--path)\")",
        description="dsenv ships ReFrame checks (reframe-hpc 4): the doctor as a preflight, "
                    "every workload's smoke and full run (sanity: dsenv's verdict; "
                    "performance: samples_per_s against dsenv's references), and the "
                    "distributed test (busbw). Run them with your site's config: reframe -C "
                    "SITE.py -c \"$(dsenv reframe --path)\" -r. Exit 0.")
    reframe.add_argument("--path", action="store_true",
                         help="print only the checks file's path")


def run_reframe(args) -> int:
    path = checks_path()
    if args.path:
        print(path)
        return 0
    print(f"dsenv's ReFrame checks: {path}")
    for name, what in CHECK_CLASSES.items():
        print(f"  {name:<17} {what}")
    print(f"run:    reframe -C SITE_CONFIG.py -c {path} -r")
    print("select: -n 'DsenvSmoke%workload=bert-squad%preset=fp32%launcher=none$'; "
          "site references: -S references=FILE; launch: -S ranks_per_node=N -S nodes=N")
    return 0
