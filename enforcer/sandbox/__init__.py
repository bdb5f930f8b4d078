"""Kernel enforcement of a compiled policy: one module per mechanism, the plan, the launcher."""

# Here rather than in plan.py so adl-exec can build its command line without importing the policy code.
DOMAINS = ("filesystem", "execution", "environment", "network", "resources")
