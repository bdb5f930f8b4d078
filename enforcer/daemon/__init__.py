"""adl-enforcerd: the daemon, its gRPC decision API, sessions and systemd integration."""
