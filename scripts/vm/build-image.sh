#!/usr/bin/env bash
# Build the test VM's image: Debian bookworm with systemd as PID 1 on cgroup v2, a user
# (tester, uid 1000) whose systemd manager runs from boot (lingering), and Python with what
# Headroom's engine imports (Debian packages only). The recipe: ../../../shared/VM-CGROUP2.md.
#
#   scripts/vm/build-image.sh          build it unless the cache has it; print its folder
#   scripts/vm/build-image.sh --path   print the folder it is (or would be) in, build nothing
#
# The image is cached outside the checkout, keyed by a hash of this script (the recipe):
# $HEADROOM_VM_CACHE, else /var/cache/headroom-vm as root, else ~/.cache/headroom-vm. The
# folder holds vmlinuz, initrd.img and rootfs.img (raw ext4, booted read-only: snapshot=on).
# Needs root (mmdebstrap's chroot), mmdebstrap, e2fsprogs and the Debian mirror.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# What goes into the image. Changing anything in this file changes the hash: a new image.
SUITE=bookworm
MIRROR=${HEADROOM_VM_MIRROR:-http://deb.debian.org/debian}
PACKAGES=(
  systemd systemd-sysv dbus dbus-user-session libpam-systemd udev kmod passwd procps
  util-linux linux-image-amd64 initramfs-tools
  # what trayapp's engine and job manager import (the guarded jobs are plain python hogs)
  python3 python3-psutil python3-tomlkit python3-platformdirs python3-prometheus-client
)
IMAGE_SIZE=2G

key=$(sha256sum "$here/build-image.sh" | cut -c1-16)
if [[ -n ${HEADROOM_VM_CACHE:-} ]]; then
  cache=$HEADROOM_VM_CACHE
elif [[ $(id -u) == 0 ]]; then
  cache=/var/cache/headroom-vm
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/headroom-vm
fi
out=$cache/$key
if [[ ${1:-} == --path ]]; then
  echo "$out"
  exit 0
fi
if [[ -f $out/ready ]]; then
  echo "$out"
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "build-image: needs root (mmdebstrap makes a chroot)" >&2; exit 1; }
for tool in mmdebstrap mkfs.ext4; do
  command -v "$tool" >/dev/null 2>&1 \
    || { echo "build-image: $tool is missing (apt-get install mmdebstrap e2fsprogs)" >&2; exit 1; }
done

mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
boot=$work/boot
mkdir -p "$boot"

# The unit that runs a test: after boot, with the user's manager up, it mounts the 9p share,
# runs the share's payload.sh as root (it runs its own parts as the user), writes its output
# and exit status back to the share, and powers the machine off.
cat >"$work/headroom-payload" <<'EOF'
#!/bin/sh
mkdir -p /mnt/share
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /mnt/share; then
  echo "headroom-payload: the share did not mount" >/dev/console
  systemctl --no-block poweroff
  exit 1
fi
if [ -f /mnt/share/payload.sh ]; then
  echo "headroom-payload: starting" >/dev/console
  sh /mnt/share/payload.sh >/mnt/share/payload.out 2>&1
  echo $? >/mnt/share/payload.status
  echo "headroom-payload: ended with $(cat /mnt/share/payload.status)" >/dev/console
else
  echo "no payload.sh in the share" >/mnt/share/payload.out
  echo 127 >/mnt/share/payload.status
fi
sync
umount /mnt/share || true
systemctl --no-block poweroff
EOF
cat >"$work/headroom-payload.service" <<'EOF'
[Unit]
Description=Headroom test payload (from the 9p share)
After=multi-user.target user@1000.service
Wants=user@1000.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/headroom-payload
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF

include=$(IFS=,; echo "${PACKAGES[*]}")
mmdebstrap --variant=minbase --include="$include" \
  --customize-hook="chroot \"\$1\" useradd -m -u 1000 -s /bin/bash tester" \
  --customize-hook='mkdir -p "$1/var/lib/systemd/linger" && touch "$1/var/lib/systemd/linger/tester"' \
  --customize-hook='echo "/dev/vda / ext4 rw,errors=remount-ro 0 1" > "$1/etc/fstab"' \
  --customize-hook='echo headroom-vm > "$1/etc/hostname"' \
  --customize-hook='chroot "$1" passwd -d root' \
  --customize-hook='for u in apt-daily.timer apt-daily-upgrade.timer fstrim.timer e2scrub_all.timer e2scrub_reap.service systemd-timesyncd.service man-db.timer dpkg-db-backup.timer; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
  --customize-hook="install -m 0755 \"$work/headroom-payload\" \"\$1/usr/local/sbin/headroom-payload\"" \
  --customize-hook="install -m 0644 \"$work/headroom-payload.service\" \"\$1/etc/systemd/system/headroom-payload.service\"" \
  --customize-hook='mkdir -p "$1/etc/systemd/system/multi-user.target.wants" && ln -sf /etc/systemd/system/headroom-payload.service "$1/etc/systemd/system/multi-user.target.wants/headroom-payload.service"' \
  --customize-hook="cp \"\$1\"/boot/vmlinuz-* \"$boot/vmlinuz\" && cp \"\$1\"/boot/initrd.img-* \"$boot/initrd.img\"" \
  "$SUITE" "$root" "$MIRROR"

truncate -s "$IMAGE_SIZE" "$work/rootfs.img"
mkfs.ext4 -q -F -L headroom-vm -d "$root" "$work/rootfs.img"
mkdir -p "$out"
mv "$boot/vmlinuz" "$boot/initrd.img" "$work/rootfs.img" "$out/"
chmod 0644 "$out/vmlinuz" "$out/initrd.img" "$out/rootfs.img"
touch "$out/ready"
echo "$out"
