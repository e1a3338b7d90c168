#!/usr/bin/env bash
# Boot the test VM (scripts/vm/build-image.sh) once with SHARE as its 9p share, run the share's
# payload.sh in it (as root; it runs its own parts as the user tester, uid 1000, under that
# user's systemd manager), and power it off.
#
#   scripts/vm/run.sh SHARE [TIMEOUT_SECONDS]
#
# The VM writes SHARE/payload.out (the payload's output) and SHARE/payload.status (its exit
# status); the console goes to SHARE/console.log. Exits with the payload's status, 124 when the
# VM ran past TIMEOUT_SECONDS (default 600), 125 when it ended without a status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
share=${1:?usage: scripts/vm/run.sh SHARE [TIMEOUT_SECONDS]}
limit=${2:-600}
[[ -f $share/payload.sh ]] || { echo "vm: no payload.sh in $share" >&2; exit 2; }
image=$("$here/build-image.sh" --path)
[[ -f $image/ready ]] || { echo "vm: no image in $image (run scripts/vm/build-image.sh)" >&2; exit 2; }
command -v qemu-system-x86_64 >/dev/null 2>&1 \
  || { echo "vm: qemu-system-x86_64 is missing (apt-get install qemu-system-x86)" >&2; exit 2; }

rm -f "$share/payload.out" "$share/payload.status"
chmod 0777 "$share"  # the guest's user writes its results here too
smp=${HEADROOM_VM_CPUS:-2}
status=0
# KVM does not help on these machines (VM-CGROUP2.md): software emulation, every vCPU a thread.
timeout --kill-after=10 "$limit" qemu-system-x86_64 \
  -accel tcg,thread=multi -m "${HEADROOM_VM_MEMORY_MB:-2048}" -smp "$smp" \
  -nographic -no-reboot -nodefaults -serial "file:$share/console.log" -monitor none \
  -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
  -append 'root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 panic=-1 quiet' \
  -drive "file=$image/rootfs.img,if=virtio,format=raw,snapshot=on" \
  -virtfs "local,path=$share,mount_tag=share,security_model=none,id=share" \
  -nic none </dev/null || status=$?
if ((status == 124 || status == 137)); then
  echo "vm: still running after ${limit}s: stopped" >&2
  exit 124
fi
if [[ ! -f $share/payload.status ]]; then
  echo "vm: it ended (qemu status $status) without a payload status; see $share/console.log" >&2
  exit 125
fi
exit "$(cat "$share/payload.status")"
