"""The interconnect and NCCL's settings: fabric ports, rendezvous addresses, NCCL config files."""
