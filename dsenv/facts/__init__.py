"""Node facts: what this node and a Python environment are, collected without judging.

Below provision, workloads and the doctor; speaks no doctor vocabulary. Every probe takes a
:class:`dsenv.facts.node.Node` (root, environment, run, which, memo)."""
