#!/usr/bin/env bash
# The full-kernel VM lane for CI: build (or reuse) the cached Debian image, then `testbed vm test`.
#   FTB_VM_LANE=0  skip the lane;   FTB_VM_LANE=1  fail (not skip) when the image cannot be built.
# A failed image build (mirror/PyPI hiccup, no qemu) is reported and the lane is SKIPPED (exit 0) unless
# FTB_VM_LANE=1; a test failing inside a booted VM is a real failure (non-zero exit).
# Timings measured on the 2-core CI machine (TCG): see README "Full-kernel VM lane".
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${FTB_PY:-.venv/bin/python}
if [ "${FTB_VM_LANE:-auto}" = "0" ]; then
    echo "vm-lane: skipped (FTB_VM_LANE=0)"
    exit 0
fi
t0=$SECONDS
if ! bash scripts/vm-setup.sh; then
    echo "vm-lane: SKIPPED — could not install qemu/debootstrap (apt failed; see above)"
    [ "${FTB_VM_LANE:-auto}" = "1" ] && exit 1 || exit 0
fi
if ! timeout --kill-after=30 2400 "$PY" -m testbed.cli vm build; then
    echo "vm-lane: SKIPPED — the VM image could not be built (see the build log named above; often a mirror" \
         "or PyPI hiccup). The normal suite is unaffected."
    [ "${FTB_VM_LANE:-auto}" = "1" ] && exit 1 || exit 0
fi
t1=$SECONDS
timeout --kill-after=30 2700 "$PY" -m testbed.cli vm test --timeout 2600 tests -rs
rc=$?
echo "vm-lane: image ready in $((t1 - t0)) s, tests in $((SECONDS - t1)) s, exit $rc"
exit $rc
