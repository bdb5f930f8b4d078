#!/usr/bin/env bash
# Set up (if needed), then launch an example agent under an example policy: an allowed read, a denied
# read, a denied file creation, a denied exec, a denied shell; then the research agent's network
# through the egress filter (allowed and denied hosts); and the audit trail those sessions left. Needs root (Landlock
# works unprivileged, but the demo also creates cgroups and namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ADL_ENFORCER_AUDIT_DIR=${ADL_ENFORCER_AUDIT_DIR:-/tmp/adl-demo/audit}
export ADL_ENFORCER_AUDIT_KEY=${ADL_ENFORCER_AUDIT_KEY:-/tmp/adl-demo/audit-signing-key.pem}
POLICY=policies/examples/coding-agent.adl.json
WS=/tmp/adl-demo/workspace
mkdir -p $WS /tmp/adl-demo/reference
echo "print('tests pass')" > $WS/main.py
echo "DATABASE_PASSWORD=not-for-agents" > $WS/.env
echo "reference notes" > /tmp/adl-demo/reference/notes.txt
# The agent never runs as root: it runs as AGENT_USER, which owns its workspace and nothing else.
AGENT_USER=${ADL_DEMO_USER:-nobody}
chown -R "$AGENT_USER:$(id -gn "$AGENT_USER")" $WS

run() { echo; echo "\$ $*"; "$@" || echo "(exit $?)"; }
EXEC=".venv/bin/adl-exec --adl $POLICY --user $AGENT_USER --report --"
echo "== the layers adl-exec enforces for this agent"
.venv/bin/adl-exec --adl $POLICY --user $AGENT_USER --explain -- python3 $WS/main.py | sed -n '/^layers:/,$p'
echo; echo "== inside the sandbox"
run $EXEC python3 $WS/main.py                                  # allowed: run the workspace code
run $EXEC cat /tmp/adl-demo/reference/notes.txt                # allowed read
run $EXEC cat $WS/.env                                          # denied path (masked)
run $EXEC cat /etc/passwd /etc/hostname                         # outside the policy: hostname denied
run $EXEC python3 -c "open('$WS/stolen.pem', 'w').write('x')"   # creating a denied name after launch
run $EXEC python3 -c "import subprocess; subprocess.run(['curl', 'http://example.com'])"   # denied exec
run $EXEC python3 -c "import os; os.execv('/bin/sh', ['sh', '-c', 'id'])"                 # no shells
run $EXEC sh -c id                                              # refused before launch
echo; echo "== why the kernel said no, from the audit log in $ADL_ENFORCER_AUDIT_DIR (path, right, process, rule, grant)"
run .venv/bin/adl-audit search --since -10m --type decision --rule 'fs.*' --rule 'exec.*' --path /etc/hostname -n 4 --reverse
echo; echo "== the research agent's network, through the egress filter (in a lab of namespaces the demo builds)"
.venv/bin/python scripts/demo_network.py
echo; echo "== the audit trail"
run .venv/bin/adl-audit search --since -10m --type launch --type exit --type refused --type decision -n 30 --reverse
run .venv/bin/adl-audit search --since -10m --type net.connect --type net.dns --type net.summary -n 20 --reverse
run .venv/bin/adl-audit report --since -10m
run .venv/bin/adl-audit verify
