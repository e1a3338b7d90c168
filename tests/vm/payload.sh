# Run inside the test VM by its payload unit (as root): the checkout copied in from the share
# (the share is read through 9p; a copy on the VM's own disk imports faster), then the checks
# as the user tester under the user's systemd manager; their results go to the share.
set -u
rm -rf /home/tester/src /home/tester/work
cp -a /mnt/share/src /home/tester/src
mkdir -p /home/tester/work
chown -R tester:tester /home/tester/src /home/tester/work
runuser -u tester -- env -i HOME=/home/tester PATH=/usr/local/bin:/usr/bin:/bin \
  XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus \
  LANG=C.UTF-8 timeout --kill-after=10 "${HEADROOM_VM_PAYLOAD_SECONDS:-420}" \
  python3 /home/tester/src/tests/vm/payload_v2.py /mnt/share/results.json /home/tester/work
echo "payload_v2.py exited with $?"
