"""Is the Hugging Face Hub reachable? One bounded HEAD request, never a hang, never when offline."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request


def probe(endpoint: str, timeout: float) -> bool:
    """HEAD ``endpoint``: True when any HTTP answer comes back within ``timeout`` seconds.

    The request runs in a daemon thread joined with the same bound, so even a resolver that ignores
    socket timeouts (a stuck DNS lookup) cannot hold detection longer than ``timeout``.
    """
    result: list[bool] = []

    def run() -> None:
        try:
            req = urllib.request.Request(endpoint, method="HEAD", headers={"User-Agent": "cudaload-probe"})
            with urllib.request.urlopen(req, timeout=timeout):
                result.append(True)
        except urllib.error.HTTPError:
            result.append(True)  # it answered; a 4xx/5xx still means the network path works
        except Exception:
            result.append(False)

    t = threading.Thread(target=run, name="cudaload-hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])
