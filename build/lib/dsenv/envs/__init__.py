"""Environment recipes, lockfiles and the data tables behind them (GPU archs, toolkits)."""
