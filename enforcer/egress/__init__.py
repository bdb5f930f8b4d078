"""The egress host filter: the agent namespace, DNS stub, connection filter and its process."""
