"""Put first on PYTHONPATH by bench/sglang_start.py: every Python process it starts (SGLang's scheduler and
detokenizer too) writes its command line, then its stacks, to $SGLANG_START_STACKS/stacks-<pid>.txt: at
$SGLANG_START_DUMP_AT (epoch seconds, from a faulthandler timer thread: "Timeout" header), on SIGUSR1, and
on a fatal signal."""

import faulthandler
import os
import signal
import time

if os.environ.get("SGLANG_START_STACKS"):
    _file = open(os.path.join(os.environ["SGLANG_START_STACKS"], f"stacks-{os.getpid()}.txt"), "w", buffering=1)
    with open("/proc/self/cmdline", "rb") as cmdline:
        _file.write(cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:300] + "\n")
    faulthandler.enable(file=_file)
    faulthandler.register(signal.SIGUSR1, file=_file, all_threads=True)
    # The timer needs no signal: in session 6 SGLang's scheduler wrote nothing on SIGUSR1 (cause not found;
    # the detokenizer, spawned the same way, did), so its stacks come this way too.
    _delay = float(os.environ.get("SGLANG_START_DUMP_AT", "0")) - time.time()
    if _delay > 0:
        faulthandler.dump_traceback_later(_delay, file=_file)
