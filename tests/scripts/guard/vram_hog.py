"""A GPU memory hog for the VRAM guard's test: takes STEP_MB of GPU memory every EVERY seconds
on the first visible GPU, with PyTorch or CuPy, up to MAX_MB; then holds it until killed.

    python vram_hog.py torch|cupy STEP_MB EVERY MAX_MB PROGRESS_FILE

After each step the MiB taken so far and the time go to PROGRESS_FILE (a line appended).
"""

import sys
import time

backend, step_mb, every, max_mb, progress = (sys.argv[1], int(sys.argv[2]),
                                             float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
MiB = 1 << 20

if backend == "torch":
    import torch

    def take(n):
        return torch.ones(n, dtype=torch.uint8, device="cuda")

    def sync():
        torch.cuda.synchronize()
else:
    import cupy

    def take(n):
        return cupy.ones(n, dtype=cupy.uint8)

    def sync():
        cupy.cuda.Device().synchronize()

held = [take(1)]  # the CUDA context first
sync()
done = 0
while done + step_mb <= max_mb:
    held.append(take(step_mb * MiB))
    sync()
    done += step_mb
    with open(progress, "a") as f:
        f.write(f"{done} {time.time():.6f}\n")
    time.sleep(every)
while True:
    time.sleep(3600)
