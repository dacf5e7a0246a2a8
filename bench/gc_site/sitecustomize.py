"""Benchmarks only: with RLKIT_BENCH_GC_DIR set, every Python process that starts (Ray workers too,
when this folder is on PYTHONPATH) writes its garbage collections' seconds per generation, and the
collections over 5 ms with their wall-clock times, to RLKIT_BENCH_GC_DIR/<pid>.json (at most once a second)."""

import gc
import json
import os
import sys
import time

_folder = os.environ.get("RLKIT_BENCH_GC_DIR")
if _folder:
    _state = {"started": 0.0, "written": 0.0, "seconds": [0.0, 0.0, 0.0], "counts": [0, 0, 0], "long": []}

    def _record(phase, info):
        now = time.perf_counter()
        if phase == "start":
            _state["started"] = now
            return
        took, generation = now - _state["started"], info["generation"]
        _state["seconds"][generation] += took
        _state["counts"][generation] += 1
        if took > 0.005:
            _state["long"].append([round(time.time(), 3), generation, round(took, 4)])
        if now - _state["written"] > 1.0:
            _state["written"] = now
            path = os.path.join(_folder, f"{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"argv": sys.argv[:3], "seconds": _state["seconds"], "counts": _state["counts"],
                           "long": _state["long"][-2000:]}, f)
            os.replace(path + ".tmp", path)

    gc.callbacks.append(_record)
