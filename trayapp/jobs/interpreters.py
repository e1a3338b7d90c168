"""Find the Python interpreters a job could run in, and what each one has.

Discovery looks where people keep their training environments: a venv beside the script
(``.venv``, ``venv``, ``env``), the interpreter Headroom runs in (not in a frozen build, where
``sys.executable`` is the app), conda environments, pyenv versions, and ``python3``/``python`` on
PATH. Probing runs a small script in the interpreter (with a timeout) and caches the answer by the
interpreter's path and the modification times of it and of its site-packages folders.

``job_environment`` is the environment a job (or a probe) gets: the caller's, without what would
hand the job Headroom's own Python, and with the job's environment activated.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import trayapp
from trayapp.jsonvalue import JSONObject

VENV_NAMES = (".venv", "venv", "env")
MIN_PYTHON = (3, 9)
CACHE_FILE = "interpreters.json"
REMOVED = "(removed)"
_PROBE_MARK = "HEADROOM_PROBE "

# Runs in any Python, even 2.7 (so an old one says its version rather than a syntax error).
PROBE_SCRIPT = r"""
import json, os, sys
out = {"python_version": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import importlib.util as _u
    def have(name):
        return _u.find_spec(name) is not None
except ImportError:
    import imp
    def have(name):
        try:
            imp.find_module(name)
            return True
        except ImportError:
            return False
def dist_version(names):
    try:
        from importlib import metadata
    except ImportError:
        return None
    for name in names:
        try:
            return metadata.version(name)
        except Exception:
            pass
    return None
TF_DISTS = ["tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
            "tensorflow-macos", "tf-nightly", "tf-nightly-cpu"]
if have("keras") or have("tf_keras"):
    out["keras_version"] = dist_version(["keras", "tf-keras", "keras-nightly"])
if have("tensorflow"):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
        out["tf_version"] = tf.__version__
        try:
            info = dict(tf.sysconfig.get_build_info())
        except Exception:
            info = {}
        out["is_cuda_build"] = bool(info.get("is_cuda_build", tf.test.is_built_with_cuda()))
        out["cuda_version"] = info.get("cuda_version")
        out["cudnn_version"] = info.get("cudnn_version")
        out["gpus_seen"] = len(tf.config.list_physical_devices("GPU"))
        keras = sys.modules.get("keras")
        if keras is not None and getattr(keras, "__version__", None):
            out["keras_version"] = keras.__version__
    except Exception as e:
        out["tf_version"] = dist_version(TF_DISTS)
        lines = str(e).strip().splitlines() or [type(e).__name__]
        out["error"] = "TensorFlow does not import: %s" % lines[0]
sys.stdout.write("\n" + "HEADROOM_PROBE " + json.dumps(out) + "\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class Interpreter:
    path: str
    python_version: Optional[str] = None
    tf_version: Optional[str] = None
    keras_version: Optional[str] = None
    is_cuda_build: Optional[bool] = None
    cuda_version: Optional[str] = None
    cudnn_version: Optional[str] = None
    gpus_seen: Optional[int] = None  # None: unknown (no TensorFlow, or the probe failed)
    error: Optional[str] = None
    source: str = "user"  # "current" | "venv" | "conda" | "pyenv" | "path" | "user"

    def summary(self) -> str:
        """One line, e.g. ``Python 3.11 · TensorFlow 2.21 · CPU build · sees 0 GPUs``."""
        if self.python_version is None:
            return f"{self.path}: {self.error or 'unknown'}"
        parts = [f"Python {_short(self.python_version)}"]
        if self.tf_version is None:
            parts.append("no TensorFlow")
        else:
            parts.append(f"TensorFlow {_short(self.tf_version)}")
            if self.is_cuda_build is True:
                parts.append(
                    f"CUDA {self.cuda_version} build" if self.cuda_version else "CUDA build"
                )
            elif self.is_cuda_build is False:
                parts.append("CPU build")
            if self.gpus_seen is not None:
                parts.append(f"sees {self.gpus_seen} GPU" + ("" if self.gpus_seen == 1 else "s"))
        if self.error:
            parts.append(self.error)
        return " · ".join(parts)

    def to_json(self) -> JSONObject:
        return asdict(self)


def _short(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


# ---------------------------------------------------------------------------------------------
# Where environments live


def env_prefix(python: str) -> Path:
    """The environment folder of an interpreter path (``.venv/bin/python`` -> ``.venv``).

    The path is not resolved: a venv's python is a link to the base interpreter.
    """
    p = Path(os.path.abspath(python))
    if p.parent.name.lower() in ("bin", "scripts"):
        return p.parent.parent
    return p.parent


def is_environment(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").is_file() or (folder / "conda-meta").is_dir()


def python_in(prefix: Path) -> Optional[str]:
    """The interpreter inside an environment folder, or None."""
    for rel in ("bin/python3", "bin/python", "python.exe", "Scripts/python.exe"):
        candidate = prefix / rel
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _script_folders(script: str, levels: int = 2) -> List[Path]:
    folder = Path(os.path.abspath(script)).parent
    out = [folder]
    for _ in range(levels):
        if folder.parent == folder:
            break
        folder = folder.parent
        out.append(folder)
    return out


def venvs_beside(script: str) -> List[str]:
    """Interpreters of environments named .venv/venv/env in the script's folder or the two above."""
    found = []
    for folder in _script_folders(script):
        for name in VENV_NAMES:
            prefix = folder / name
            if is_environment(prefix):
                python = python_in(prefix)
                if python:
                    found.append(python)
    return found


def _conda_prefixes(environ: Mapping[str, str], home: Path, run_conda: bool) -> List[str]:
    prefixes: List[str] = []
    if environ.get("CONDA_PREFIX"):
        prefixes.append(environ["CONDA_PREFIX"])
    try:
        lines = (home / ".conda" / "environments.txt").read_text().splitlines()
    except OSError:
        lines = []
    prefixes.extend(line.strip() for line in lines if line.strip())
    conda = environ.get("CONDA_EXE") or shutil.which("conda", path=environ.get("PATH"))
    if run_conda and conda:
        try:
            done = subprocess.run(
                [conda, "env", "list", "--json"],
                capture_output=True,
                text=True,
                timeout=15,
                stdin=subprocess.DEVNULL,
            )
            prefixes.extend(json.loads(done.stdout).get("envs", []))
        except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
            pass
    return prefixes


def _pyenv_root(environ: Mapping[str, str], home: Path) -> Optional[Path]:
    if environ.get("PYENV_ROOT"):
        return Path(environ["PYENV_ROOT"])
    default = home / ".pyenv"
    if default.is_dir():
        return default
    pyenv = shutil.which("pyenv", path=environ.get("PATH"))
    if pyenv:
        try:
            done = subprocess.run(
                [pyenv, "root"],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode == 0 and done.stdout.strip():
                return Path(done.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def discover_with_sources(
    script: Optional[str] = None,
    *,
    environ: Optional[Mapping[str, str]] = None,
    home: Optional[Path] = None,
    run_conda: bool = True,
) -> List[Tuple[str, str]]:
    """``(path, source)`` of each interpreter found, best guesses first, without duplicates."""
    environ = os.environ if environ is None else environ
    home = Path(os.path.expanduser("~")) if home is None else home
    out: List[Tuple[str, str]] = []
    seen: set = set()

    def add(path: Optional[str], source: str) -> None:
        if not path:
            return
        try:
            real = os.path.realpath(path)
        except OSError:
            return
        # Two venvs share one base interpreter: keep both, keyed by their own folder.
        key = (real, str(env_prefix(path)))
        if key in seen:
            return
        seen.add(key)
        out.append((path, source))

    if script:
        for python in venvs_beside(script):
            add(python, "venv")
    if not _frozen() and sys.executable:
        add(sys.executable, "current")
    for prefix in _conda_prefixes(environ, home, run_conda):
        add(python_in(Path(prefix)), "conda")
    root = _pyenv_root(environ, home)
    if root is not None:
        for folder in sorted((root / "versions").glob("*")):
            add(python_in(folder), "pyenv")
    for name in ("python3", "python"):
        add(shutil.which(name, path=environ.get("PATH")), "path")
    return out


def discover(script: Optional[str] = None) -> List[str]:
    """Paths of the interpreters found (see ``discover_with_sources``)."""
    return [path for path, _ in discover_with_sources(script)]


def default_python(script: str) -> str:
    """The interpreter a job uses when none is given: a venv beside the script (or one or two
    folders up), else the Python Headroom runs in, and in a frozen build ``python3``/``python``
    on PATH (the bare name when there is none, which validation then reports)."""
    beside = venvs_beside(script)
    if beside:
        return beside[0]
    if not _frozen() and sys.executable:
        return sys.executable
    for name in ("python3", "python"):
        found = shutil.which(name)
        if found:
            return found
    return "python" if os.name == "nt" else "python3"


# ---------------------------------------------------------------------------------------------
# The job's environment


def _norm(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _inside(path: str, root: str) -> bool:
    try:
        a, b = _norm(path), _norm(root)
        return os.path.commonpath([a, b]) == b
    except (ValueError, OSError):
        return False


def headroom_roots(frozen: bool, bundle_dir: Optional[str] = None) -> List[str]:
    """Folders that belong to Headroom's own install: not for the job's Python."""
    roots = [os.path.dirname(os.path.dirname(os.path.abspath(trayapp.__file__)))]
    if frozen:
        roots.append(
            bundle_dir or getattr(sys, "_MEIPASS", None) or os.path.dirname(sys.executable)
        )
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        roots.append(sys.prefix)
    return roots


def _own_interpreter(python: str, frozen: bool) -> bool:
    if frozen or not sys.executable:
        return False
    try:
        return _norm(python) == _norm(sys.executable) and str(env_prefix(python)) == str(
            env_prefix(sys.executable)
        )
    except OSError:
        return False


class _Changes:
    """An environment being changed, with each change as (name, value, reason); a removed
    variable has the value ``REMOVED``."""

    def __init__(self, env: Dict[str, str]):
        self.env = env
        self.settings: List[Tuple[str, str, str]] = []

    def set(self, name: str, value: str, reason: str) -> None:
        self.env[name] = value
        self.settings.append((name, value, reason))

    def remove(self, name: str, reason: str) -> None:
        if name in self.env:
            del self.env[name]
            self.settings.append((name, REMOVED, reason))


def job_environment(
    python: str,
    base_env: Mapping[str, str],
    *,
    frozen: Optional[bool] = None,
    bundle_dir: Optional[str] = None,
) -> Tuple[Dict[str, str], List[Tuple[str, str, str]]]:
    """(environment, settings) for running ``python``: ``base_env`` without Headroom's own
    Python environment (PYTHONPATH/PYTHONHOME entries into Headroom's install, Headroom's
    VIRTUAL_ENV, a frozen build's library path) and with the interpreter's venv or conda
    environment activated. ``settings`` lists each change as (name, value, reason); a removed
    variable has the value ``REMOVED``."""
    frozen = _frozen() if frozen is None else frozen
    c = _Changes(dict(base_env))
    if frozen:
        _without_bundle(c, bundle_dir)
    if not _own_interpreter(python, frozen):
        _without_own_install(c, python, frozen, bundle_dir)
    _activated(c, python)
    return c.env, c.settings


def _without_bundle(c: _Changes, bundle_dir: Optional[str]) -> None:
    """A frozen build: the library path as it was before the app bundle changed it, and no
    variable pointing into the bundle."""
    bundle: str = bundle_dir or getattr(sys, "_MEIPASS", None) or os.path.dirname(sys.executable)
    env = c.env
    original = env.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is not None:
        c.settings.append(("LD_LIBRARY_PATH_ORIG", REMOVED, "the app bundle's saved copy"))
        c.set(
            "LD_LIBRARY_PATH",
            original,
            "restored to its value before Headroom's app bundle changed it",
        )
    for name, value in list(env.items()):
        entries = value.split(os.pathsep)
        keep = [e for e in entries if not (e and os.path.isabs(e) and _inside(e, bundle))]
        if len(keep) == len(entries):
            continue
        if any(keep):
            c.set(name, os.pathsep.join(keep), "without entries into Headroom's app bundle")
        else:
            c.remove(name, "pointed into Headroom's app bundle")


def _without_own_install(c: _Changes, python: str, frozen: bool, bundle_dir: Optional[str]) -> None:
    """Another interpreter than Headroom's: no PYTHONPATH/PYTHONHOME into Headroom's install,
    and not Headroom's own virtualenv."""
    env = c.env
    roots = headroom_roots(frozen, bundle_dir)
    for name in ("PYTHONPATH", "PYTHONHOME"):
        current = env.get(name)
        if not current:
            continue
        entries = current.split(os.pathsep)
        keep = [e for e in entries if not (e and any(_inside(e, r) for r in roots))]
        if len(keep) == len(entries):
            continue
        if name == "PYTHONPATH" and any(keep):
            c.set(name, os.pathsep.join(keep), "without entries into Headroom's own install")
        else:
            c.remove(name, "pointed into Headroom's own install, not the job's Python")
    venv = env.get("VIRTUAL_ENV")
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    if venv and in_venv and not frozen and _norm(venv) == _norm(sys.prefix):
        if not _inside(os.path.abspath(python), venv):
            c.remove("VIRTUAL_ENV", "Headroom's own virtualenv, not the job's")
            c.remove("VIRTUAL_ENV_PROMPT", "Headroom's own virtualenv, not the job's")
            bin_dir = os.path.join(venv, "Scripts" if os.name == "nt" else "bin")
            path_entries = env.get("PATH", "").split(os.pathsep)
            keep = [e for e in path_entries if not (e and _norm(e) == _norm(bin_dir))]
            if len(keep) != len(path_entries):
                c.set("PATH", os.pathsep.join(keep), "without Headroom's own virtualenv")


def _activated(c: _Changes, python: str) -> None:
    """The interpreter's venv or conda environment, as if activated."""
    env = c.env
    prefix = env_prefix(python)
    if (prefix / "pyvenv.cfg").is_file():
        bin_dir = os.path.dirname(os.path.abspath(python))
        if env.get("VIRTUAL_ENV") != str(prefix):
            c.set("VIRTUAL_ENV", str(prefix), "the job's virtualenv, as if activated")
        _prepend_path(env, c.settings, [bin_dir], "the job's virtualenv first, as if activated")
    elif (prefix / "conda-meta").is_dir():
        if env.get("CONDA_PREFIX") != str(prefix):
            c.set("CONDA_PREFIX", str(prefix), "the job's conda environment, as if activated")
        if os.name == "nt":
            dirs = [
                str(prefix),
                str(prefix / "Library" / "mingw-w64" / "bin"),
                str(prefix / "Library" / "usr" / "bin"),
                str(prefix / "Library" / "bin"),
                str(prefix / "Scripts"),
            ]
        else:
            dirs = [str(prefix / "bin")]
        _prepend_path(
            env, c.settings, dirs, "the job's conda environment first (its CUDA libraries)"
        )


def _prepend_path(
    env: Dict[str, str], settings: List[Tuple[str, str, str]], dirs: List[str], reason: str
) -> None:
    entries = [e for e in env.get("PATH", "").split(os.pathsep) if e]
    if entries[: len(dirs)] == dirs:
        return
    rest = [e for e in entries if e not in dirs]
    value = os.pathsep.join(dirs + rest)
    env["PATH"] = value
    settings[:] = [s for s in settings if s[0] != "PATH"]
    settings.append(("PATH", value, reason))


# ---------------------------------------------------------------------------------------------
# Probing


def _stamp(path: str) -> Optional[List[Any]]:
    """What must not change for a cached probe to stand: the interpreter and its packages."""
    try:
        real = os.path.realpath(path)
        parts: List[Any] = [os.stat(real).st_mtime_ns]
    except OSError:
        return None
    prefix = env_prefix(path)
    patterns = [
        str(prefix / "lib" / "python*" / "site-packages"),
        str(prefix / "Lib" / "site-packages"),
        str(prefix / "lib" / "site-packages"),
    ]
    for pattern in patterns:
        for folder in sorted(glob.glob(pattern)):
            try:
                parts.append([folder, os.stat(folder).st_mtime_ns])
            except OSError:
                pass
    return parts


def _load_cache(cache_dir: Path) -> Dict[str, Any]:
    try:
        data = json.loads((cache_dir / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(cache_dir: Path, data: Dict[str, Any]) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".interpreters-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, cache_dir / CACHE_FILE)
    except OSError:
        pass  # a cache that cannot be written only costs a probe next time


_FIELDS = (
    "python_version",
    "tf_version",
    "keras_version",
    "is_cuda_build",
    "cuda_version",
    "cudnn_version",
    "gpus_seen",
    "error",
)


def _from_answer(path: str, source: str, answer: Mapping[str, Any]) -> Interpreter:
    values = {k: answer.get(k) for k in _FIELDS}
    version = values.get("python_version")
    if isinstance(version, str) and not values.get("error"):
        try:
            numbers = tuple(int(x) for x in version.split(".")[:2])
        except ValueError:
            numbers = ()
        if numbers and numbers < MIN_PYTHON:
            short = _short(version)
            values["error"] = f"Python {short} is too old for Headroom's runner (3.9 or newer)"
    return Interpreter(path=path, source=source, **values)


def probe(
    path: str,
    cache_dir: Optional[Path] = None,
    timeout: float = 60,
    source: str = "user",
    env: Optional[Mapping[str, str]] = None,
) -> Interpreter:
    """What ``path`` has: Python, TensorFlow and Keras versions, CUDA build, GPUs TensorFlow sees.

    Runs the interpreter once (unless ``cache_dir`` holds an answer for it as it is now). Never
    raises for a bad interpreter: the problem is in ``error``.
    """
    stamp = _stamp(path)
    if stamp is None:
        return Interpreter(path=path, source=source, error="not found")
    key = os.path.abspath(path)
    if cache_dir is not None:
        cached = _load_cache(cache_dir).get(key)
        if isinstance(cached, dict) and cached.get("stamp") == stamp:
            return _from_answer(path, source, cached.get("answer", {}))
    run_env, _ = job_environment(path, os.environ if env is None else env)
    try:
        done = subprocess.run(
            [path, "-c", PROBE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=run_env,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        return Interpreter(path=path, source=source, error=f"no answer within {timeout:g} s")
    except OSError as e:
        return Interpreter(path=path, source=source, error=f"cannot run it: {e.strerror or e}")
    answer = None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_PROBE_MARK):
            try:
                answer = json.loads(line[len(_PROBE_MARK) :])
            except ValueError:
                answer = None
            break
    if not isinstance(answer, dict):
        lines = [x for x in done.stderr.strip().splitlines() if x.strip()]
        why = lines[-1].strip() if lines else "no answer"
        return Interpreter(
            path=path,
            source=source,
            error=f"not a working Python (exit status {done.returncode}: {why})",
        )
    if cache_dir is not None:
        data = _load_cache(cache_dir)
        data[key] = {"stamp": stamp, "answer": answer}
        _save_cache(cache_dir, data)
    return _from_answer(path, source, answer)
