"""Where agents already run: an MCP gateway, a Claude Code hook, framework wrappers. (The daemon's
telemetry exporters are daemon modules: enforcer/daemon/telemetry.py.)

One module per integration; each imports its third-party library (an optional extra of the
package) only when it is itself imported, so the daemon and the launcher never load them.
"""
