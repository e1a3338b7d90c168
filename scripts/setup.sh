#!/usr/bin/env bash
# Set up Headroom in a virtual environment beside the source (.venv).
#   scripts/setup.sh          the app
#   scripts/setup.sh test     the app and everything the tests need (tensorflow-cpu, pytest...)
# As root on Debian/Ubuntu it also installs the system packages Qt and the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-app}

python=${PYTHON:-}
if [[ -z $python ]]; then
  # The first interpreter that really runs (a pyenv shim may name one that is not installed)
  # and is new enough.
  for candidate in python3 python3.12 python3.11 python3.10 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 9))' >/dev/null 2>&1; then
      python=$candidate; break
    fi
  done
fi
[[ -n $python ]] || { echo "setup: Python 3.9 or newer is needed (none found on PATH)" >&2; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
  || { echo "setup: $python is older than Python 3.9" >&2; exit 1; }

packages=()
if [[ $what == test ]]; then
  mapfile -t packages < <(grep -vE '^\s*(#|$)' scripts/debian-packages.txt)
else
  # Qt's xcb platform plugin needs these on Debian and Ubuntu.
  packages=(libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 libdbus-1-3)
fi
if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]]; then
      echo "setup: installing ${missing[*]}"
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "setup: these system packages are missing: ${missing[*]}" >&2
      echo "setup: install them with: sudo apt-get install ${missing[*]}" >&2
    fi
  fi
fi

if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [[ $what == test ]]; then
  .venv/bin/python -m pip install -q -e '.[test,build]'
  # Keras 2 (tf_keras), for the tests of what a Keras 2 job gets: the release that matches the
  # installed TensorFlow, without its dependency on the "tensorflow" package (tensorflow-cpu is
  # that TensorFlow). Without it those tests are skipped.
  tf=$(.venv/bin/python -c 'import importlib.metadata as m; print(".".join(m.version("tensorflow-cpu").split(".")[:2]))' 2>/dev/null || true)
  if [[ -n $tf ]]; then
    .venv/bin/python -m pip install -q --no-deps "tf-keras==$tf.*" \
      || echo "setup: no tf-keras $tf: the Keras 2 tests are skipped"
  fi
else
  .venv/bin/python -m pip install -q -e .
fi
if [[ $what == test ]]; then
  # The test VM's image (tests/vm): built once, cached outside the checkout by its recipe's
  # hash, so the tests only boot it. It needs root (a chroot); without it those tests skip.
  if [[ $(id -u) == 0 ]] && command -v mmdebstrap >/dev/null 2>&1; then
    image=$(scripts/vm/build-image.sh --path)
    if [[ ! -f $image/ready ]]; then
      echo "setup: building the test VM image in $image (a few minutes, once)"
      scripts/vm/build-image.sh >"${TMPDIR:-/tmp}/headroom-vm-build.log" 2>&1 \
        || echo "setup: the test VM image was not built (see ${TMPDIR:-/tmp}/headroom-vm-build.log): the vm tests are skipped" >&2
    fi
  else
    echo "setup: not root (or no mmdebstrap): the test VM image is not built, the vm tests are skipped"
  fi
fi
echo "setup: ready ($(.venv/bin/headroom --version))"
