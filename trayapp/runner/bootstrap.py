"""Entry script of a job: ``python bootstrap.py SCRIPT [ARGS...]``, or of a Jupyter kernel:
``python bootstrap.py --kernel -f CONNECTION_FILE``.

Runs in the user's interpreter, which does not have Headroom installed (and in frozen builds this
folder ships as plain source). It loads the runner package from this folder under a private name,
so that nothing here shadows the user's modules (a ``protocol.py`` beside their script stays
theirs), then runs the script as ``__main__``.
"""

import importlib
import importlib.util
import os
import sys

_PACKAGE = "_headroom_runner"
_MODULES = (
    "protocol",
    "channel",
    "hooks",
    "tfoptions",
    "training",
    "priority",
    "joblog",
    "fithook",
    "job",
)


def _load(kernel=False):
    here = os.path.dirname(os.path.realpath(__file__))
    # Python put this folder first on sys.path; the user's imports must not find our modules.
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.util.spec_from_file_location(
        _PACKAGE, os.path.join(here, "__init__.py"), submodule_search_locations=[here]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE] = package
    spec.loader.exec_module(package)
    if kernel:  # what a kernel needs before ipykernel starts; the rest when it is used
        return importlib.import_module(_PACKAGE + ".kernel")
    for name in _MODULES:
        importlib.import_module(_PACKAGE + "." + name)
    return sys.modules[_PACKAGE + ".job"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--kernel"]:
        _load(kernel=True).main(sys.argv[2:], bootstrap_file=os.path.realpath(__file__))
    else:
        _load().main(sys.argv[1:], bootstrap_file=os.path.realpath(__file__))
