"""conda recipes (environment.yml, one per stack) and their conda-lock.yml locks.

``NAME.yml`` is what a person edits; ``NAME.conda-lock.yml`` is what `dsenv provision
--kind conda` installs (every package pinned with its sha256), made from it with
`dsenv lock --kind conda --stack NAME` on a machine with micromamba, mamba or conda.
"""
