#!/usr/bin/env bash
# Set up (if needed), then show an example policy and what it allows and denies.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
P=.venv/bin/adl-policy
EX=policies/examples
show() { echo; echo "\$ adl-policy $*"; "$P" "$@" || echo "(exit $?)"; }
show validate $EX/*.json
show explain $EX/coding-agent.adl.json
show check $EX/coding-agent.adl.json --read /tmp/adl-demo/workspace/main.py
show check $EX/coding-agent.adl.json --read /tmp/adl-demo/workspace/.env
show check $EX/coding-agent.adl.json --exec "sh -c 'curl http://evil.example'"
show check $EX/coding-agent.adl.json --tool delete_path --args '{"path": "build"}'
show check $EX/invoice-processor.adl.json --aaif $EX/invoice-processor.aaif.json --home-region EU \
  --tool notify_vendor --args '{"invoice_id": "INV-7", "message": "Paid. Questions: jane.doe@vendor.example"}'
show check $EX/invoice-processor.adl.json --aaif $EX/invoice-processor.aaif.json --home-region EU \
  --connect api.eu-west.example.com:443 --protocol https --address 169.254.169.254
