#!/usr/bin/env bash
# Run a command with kvpd importable, and `kvpd` and `python` on PATH, straight from this
# checkout without installing it: for a machine that already has torch and transformers but no
# network (a lent GPU machine). When simpy, pyzmq or pydantic is missing, the wheels in .whl/
# at the checkout's root (fetched elsewhere for that machine's Python) go into /tmp/kvpd-site
# first. Example, on such a machine:
#
#   bash bench/run_from_checkout.sh bash bench/gpu_validate.sh /tmp/gv
#
# `python` becomes a script that runs python3 (a symlink to a virtual environment's python3
# would lose the environment: the first GPU attempt failed that way).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SITE=/tmp/kvpd-site
BIN=/tmp/kvpd-bin
if ! python3 -c "import simpy, zmq, pydantic" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null
then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi
mkdir -p "$BIN"
printf '#!/bin/sh\nexec python3 -m kvpd.cli "$@"\n' > "$BIN/kvpd"
rm -f "$BIN/python"
command -v python > /dev/null || printf '#!/bin/sh\nexec python3 "$@"\n' > "$BIN/python"
chmod +x "$BIN"/*
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$BIN:$PATH"
exec "$@"
