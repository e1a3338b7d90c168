"""Print this process's resource limits, one "NAME SOFT HARD" line each (-1: unlimited)."""

import resource

for name in ("AS", "DATA", "RSS", "NOFILE", "NPROC", "STACK", "CORE", "CPU"):
    soft, hard = resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))
    print(name, soft, hard, flush=True)
