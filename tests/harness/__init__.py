"""What the tests stand on; no tests here (pytest collects only tests/**/test_*.py).

- cli: the one dsenv runner (``dsenv``, ``start_dsenv``/``finish``, ``dsenv_in_process``),
  with a timeout that kills the process group, the environment (``base``, ``drop``, ``env``)
  and rc/stdout/stderr back; ``explain`` and ``one_line`` for assertions.
- doctor_cli: ``dsenv doctor --json`` in a clean environment, its report read back, fake
  tools printing recorded outputs. recorded: tests/fixtures and ``fixture_text``.
- workload_runs: workload smokes and runs under each launcher. tinywheels: tiny wheels, their
  lock and the environment ``dsenv provision`` makes of them. pyenvs: venvs, conda prefixes
  and fake torch wheels. tarfiles: small sdists. nvcc: shared objects with device code.
  sysfs: /sys trees from recorded fabric tools.
- hubserver: a Hugging Face Hub on 127.0.0.1 (also run by bench/ and GPU scripts:
  ``from tests.harness import hubserver``). condachannel, condashim: a local conda channel
  and a micromamba-compatible command.
- netns, slurmcluster: namespaced hosts and the test Slurm cluster
  (``python -m tests.harness.slurmcluster --hosts 2``). mountns, fusefs: private mount
  namespaces and a FUSE file system without working locks.
"""
