"""``dsenv doctor``: health checks for the login node and inside the job."""
