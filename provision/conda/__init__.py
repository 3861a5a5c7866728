"""conda environments: recipes, locking with conda-lock, install with py-rattler, pip on top."""
