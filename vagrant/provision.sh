#!/usr/bin/env bash
# Provision a Debian 12 machine with a full distribution kernel for fabric-testbed.
#
# The ONE provisioning path shared by both VMs:
#   * Vagrant runs it as root inside the box (project synced at /vagrant), see ../Vagrantfile;
#   * `testbed vm build` runs it as root in the chroot of the debootstrapped image (project copied to
#     /opt/fabric-testbed/src), and its hash keys the cached image.
# It installs what the distribution kernel lets the testbed use on top of the README's setup (Soft-RoCE user
# space, perftest, kernel headers for BCC), then runs scripts/setup.sh exactly as the README does, with the venv
# outside the synced folder, and finally `testbed doctor` (skipped in the image chroot, where the running kernel is
# the host's; `testbed vm build` runs doctor in the booted guest instead).
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FTB_VENV="${FTB_VENV:-/opt/fabric-testbed/venv}"
export DEBIAN_FRONTEND=noninteractive
start=$SECONDS

# Soft-RoCE (rdma_rxe) user space and benchmarks, tc/ip, module loading, headers for BCC on this kernel.
# Headers must match the kernel that boots: the running one (Vagrant) or the one in the image (chroot).
if [ -n "${FTB_PROVISION_CHROOT:-}" ]; then
    KREL=$(ls /lib/modules | sort -V | tail -1)
else
    KREL=$(uname -r)
fi
EXTRA=(rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest iproute2 kmod procps ethtool
       "linux-headers-$KREL" python3 python3-venv ca-certificates)
missing=()
for p in "${EXTRA[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "provision: installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi

# Modules the testbed uses on a distribution kernel (loaded at boot by systemd; the lane's init loads them itself).
mkdir -p /etc/modules-load.d
printf '%s\n' rdma_rxe sch_netem sch_red sch_fq sch_prio sch_htb sch_tbf cls_bpf act_bpf > \
    /etc/modules-load.d/fabric-testbed.conf

# The README's setup: system packages + the venv (here outside the project so a synced folder stays clean).
bash "$SRC/scripts/setup.sh"
ln -sf "$FTB_VENV/bin/testbed" /usr/local/bin/testbed

echo "provision: done in $((SECONDS - start)) s"
if [ -z "${FTB_PROVISION_CHROOT:-}" ]; then
    testbed doctor
fi
