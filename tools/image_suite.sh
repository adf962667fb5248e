#!/usr/bin/env bash
# Run inside the octavo CPU image (as its non-root user) by tools/image_smoke.py:
#   docker run --rm --network host -v <export of the repo without octavo/>:/src:ro \
#     --entrypoint bash octavo:<v>-cpu /src/tools/image_suite.sh [pytest args]
# Copies the tests next to a link to the octavo package *installed in the image* (so the suite
# tests the image's wheel and its compiled kernels, not a source tree), installs the test
# tools into the user's site-packages (torch stays pinned by the image's constraints), then runs
# `nox --no-venv -s test-cpu -- <pytest args>`.
set -euo pipefail

src="${OCTAVO_SUITE_SRC:-/src}"
suite="$(mktemp -d)"
cp -a "$src/." "$suite/"
if [[ -e "$suite/octavo" ]]; then
    echo "image_suite.sh: $src has an octavo/ folder; mount a tree without it" >&2
    exit 2
fi
site="$(cd / && python3 -c 'import octavo, os; print(os.path.dirname(octavo.__file__))')"
ln -s "$site" "$suite/octavo"
echo "== tests against the installed package: $site"

# The test extra, with the extras it names through octavo[...] expanded (recursively).
python3 - "$suite/pyproject.toml" > "$suite/.test-requirements.txt" <<'EOF'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
todo, seen = ["test"], set()
while todo:
    extra = todo.pop()
    if extra in seen:
        continue
    seen.add(extra)
    for req in extras[extra]:
        own = re.fullmatch(r"octavo\[([\w,\s-]+)\]", req.replace(" ", ""))
        if own:
            todo += own.group(1).split(",")
        else:
            print(req)
EOF
export PATH="$HOME/.local/bin:$PATH"
pip install --user --no-cache-dir --quiet --constraint /etc/octavo-constraints.txt \
    -r "$suite/.test-requirements.txt" nox pytest-xdist

cd "$suite"
nox --no-venv -s test-cpu -- "$@"
