"""Is the Hugging Face Hub reachable? One bounded HEAD request, never a hang, never when offline.

The request runs on a daemon thread (:class:`Probe`), so a caller can start it and ask for the answer later:
``load_model()`` asks only when a decision depends on it (a Hub kernel that is not cached), after
transformers has imported, so the round trip (DNS, TLS, HEAD; the whole timeout where a firewall drops the
packets) is hidden under the imports instead of added before them.
"""

from __future__ import annotations

import threading
import time


class Probe:
    """One HEAD request to ``endpoint`` on a daemon thread, started at construction.

    :meth:`answer` waits at most until ``timeout`` seconds after the start, so even a resolver that ignores
    socket timeouts (a stuck DNS lookup) cannot hold the caller longer than that."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._result: list[bool] = []
        self._answer: bool | None = None
        self._deadline = time.monotonic() + timeout
        self._thread = threading.Thread(target=self._run, name="cudaload-hub-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # imported here, not at module level: urllib.request and http.client cost ~30 ms to import, which
        # every `import cudaload.detection` would pay for a probe that offline machines never make
        import urllib.error
        import urllib.request

        try:
            req = urllib.request.Request(
                self.endpoint, method="HEAD", headers={"User-Agent": "cudaload-probe"}
            )
            with urllib.request.urlopen(req, timeout=self.timeout):
                self._result.append(True)
        except urllib.error.HTTPError:
            self._result.append(True)  # it answered; a 4xx/5xx still means the network path works
        except Exception:
            self._result.append(False)

    def answer(self) -> bool:
        """True when any HTTP answer came back within the timeout (waits for it, never past the deadline).

        The first answer given is the answer for the life of the probe: a request still running at the deadline
        may finish later, and one process must not see the Hub unreachable in one snapshot and reachable in the
        next (a plan made from the first would disagree with a later explain)."""
        if self._answer is None:
            self._thread.join(max(0.0, self._deadline - time.monotonic()))
            self._answer = bool(self._result and self._result[0])
        return self._answer
