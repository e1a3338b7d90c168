#!/usr/bin/env bash
# The real-hardware GPU checks, on a machine with an NVIDIA GPU and whatever Python it has
# (PyTorch or CuPy for the CUDA process; nvidia-ml-py, psutil and pytest for the tests).
#     tests/gpu/run_on_device.sh [pytest args...]
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
"$PY" -m pip install -q pytest platformdirs tomlkit 2>/dev/null || true
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

# nvidia-ml-py is one pure-Python file: borrow it from the project's venv when it is missing.
if ! "$PY" -c "import pynvml" 2>/dev/null; then
    borrowed=$(ls .venv/lib/python3*/site-packages/pynvml.py 2>/dev/null | head -n 1)
    if [ -n "$borrowed" ]; then
        mkdir -p /tmp/headroom-pynvml && cp "$borrowed" /tmp/headroom-pynvml/
        export PYTHONPATH="$PYTHONPATH:/tmp/headroom-pynvml"
    fi
fi

"$PY" - <<'PYEOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("pynvml", "psutil", "pytest", "torch", "cupy"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:8s} {getattr(mod, '__version__', 'ok')}")
    except Exception as e:
        print(f"{name:8s} missing ({e.__class__.__name__})")
PYEOF
nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu,power.draw --format=csv,noheader,nounits || true

exec "$PY" -m pytest -c tests/gpu/device-pytest.ini --rootdir . --confcutdir tests/gpu \
    -p no:cacheprovider tests/gpu -v "$@"
