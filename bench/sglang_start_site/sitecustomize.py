"""Put first on PYTHONPATH by bench/sglang_start.py: every Python process it starts (SGLang's scheduler and
detokenizer too) writes its command line, then its stacks on SIGUSR1 or a fatal signal, to
$SGLANG_START_STACKS/stacks-<pid>.txt."""

import faulthandler
import os
import signal

if os.environ.get("SGLANG_START_STACKS"):
    _file = open(os.path.join(os.environ["SGLANG_START_STACKS"], f"stacks-{os.getpid()}.txt"), "w", buffering=1)
    with open("/proc/self/cmdline", "rb") as cmdline:
        _file.write(cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:300] + "\n")
    faulthandler.enable(file=_file)
    faulthandler.register(signal.SIGUSR1, file=_file, all_threads=True)
