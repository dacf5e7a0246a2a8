"""The candidate's side of the code reward: runs inside the candidate's sandbox, never imported by rlkit.

rlkit.core.rewards.code copies this file in as the sandbox's program.py, next to solution.py (the
problem's prompt and the model's response) and plain_data.py, and calls `serve(entry_point)` with the
function's name. It runs the solution, then answers calls over its stdin and stdout, one line each:
  first line out:  {"ready": true} or {"ready": false, "error": "..."}
  in:              {"id": N, "args": <plain list>, "kwargs": <plain dict>}
  out:             {"id": N, "value": <plain>}, or {"id": N, "raised": "ExceptionName", "message": "..."}
The solution's own prints go to stderr and its stdin is empty, so an honest program that prints
cannot break the protocol. Nothing here is trusted: the solution can replace any of it, and the
judge's side (rlkit.core.rewards.code and judge_server.py) treats every line as the candidate's.
"""

import os

import plain_data


def serve(entry_point: str) -> None:
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)

    def send(message: dict) -> None:
        replies.write(plain_data.dumps(message))
        replies.flush()

    solution = {"__name__": "solution"}
    try:
        with open("solution.py") as source:
            exec(compile(source.read(), "solution.py", "exec"), solution)
        function = solution[entry_point]
    except BaseException as exc:  # noqa: BLE001 - whatever stops the program, the answer is "it does not run"
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return
    send({"ready": True})
    for line in requests:
        request = plain_data.loads(line)
        try:
            value = function(*plain_data.decode(request["args"]), **plain_data.decode(request["kwargs"]))
            reply = {"id": request["id"], "value": plain_data.encode(value)}
        except BaseException as exc:  # noqa: BLE001 - the call's own failure is its answer
            reply = {"id": request["id"], "raised": type(exc).__name__, "message": str(exc)[:200]}
        try:
            send(reply)
        except ValueError:  # json refuses it (an int of over 4300 digits)
            send({"id": request["id"], "raised": "NotPlain"})
