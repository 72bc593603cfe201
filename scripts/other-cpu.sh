#!/usr/bin/env bash
# Runs pytest as it would run on another x86 CPU: pytest, and every server and command it starts, under qemu-x86_64
# emulating that CPU model, so that onnxruntime and NumPy pick that CPU's kernels. The suite must pass on whatever
# CPU CI lands on (an Intel Xeon and an AMD EPYC so far); this shows, on one machine, which tests compare digits
# that the kernels decide.
#
#   bash scripts/other-cpu.sh CPU [pytest arguments]     e.g. bash scripts/other-cpu.sh Haswell tests/core
#
# CPU is a qemu model: Haswell (AVX2 and FMA), Nehalem (SSE4.2 only); `qemu-x86_64 -cpu help` lists them. qemu's
# emulation has no AVX-512, so a native run on an AVX-512 machine and these two make three kernel families.
# Emulation is 5 to 20 times slower; torch (the exports) slower still: pick the tests.
set -euo pipefail
cpu=${1:?usage: bash scripts/other-cpu.sh CPU [pytest arguments]}
shift
cd "$(dirname "$0")/.."
venv=$PWD/.venv
[ -x "$venv/bin/python" ] || { echo "no .venv here: run the README's test set-up first" >&2; exit 1; }
command -v qemu-x86_64 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null
real=$(readlink -f "$venv/bin/python")

# A venv of the same packages whose python is qemu running the real interpreter: sys.executable is the wrapper
# (qemu's -0 sets argv[0]), so the servers that tests start with sys.executable or the venv's scripts run emulated.
wrap=$(mktemp -d)
trap 'rm -rf "$wrap"' EXIT
mkdir "$wrap/bin"
ln -s "$venv/lib" "$wrap/lib"
sed "s|$venv|$wrap|g" "$venv/pyvenv.cfg" >"$wrap/pyvenv.cfg"
printf '#!/bin/sh\nexec qemu-x86_64 -cpu %s -0 "%s" "%s" "$@"\n' "$cpu" "$wrap/bin/python" "$real" >"$wrap/bin/python"
chmod +x "$wrap/bin/python"
for script in "$venv"/bin/*; do
    name=$(basename "$script")
    case "$name" in python*|activate*|pip*) continue ;; esac
    head -c 2 "$script" | grep -q '#!' || continue
    sed "1s|^#!.*python.*$|#!$wrap/bin/python|" "$script" >"$wrap/bin/$name"
    chmod +x "$wrap/bin/$name"
done
# qemu's user mode warns once per process about CPU features it does not emulate (TSX): noise, not a result.
PATH="$wrap/bin:$PATH" "$wrap/bin/python" -m pytest -p no:cacheprovider "$@" 2> >(grep -v "TCG doesn't support" >&2)
