"""AWS's two-minute spot interruption notice, read from the instance metadata service.

AWS announces the interruption of a spot instance about two minutes ahead at
``/latest/meta-data/spot/instance-action`` (404 while none is announced). A GPU worker polls
it in a daemon thread (IMDSv2: a session token first, by PUT); when a notice comes, the
training loop saves its state inside the epoch after the step in flight
(:class:`workloads.kinds.rerank.in_epoch_checkpoints.InEpochCheckpoints`), so the restarted attempt loses at
most that step instead of everything since the last save.

``ORCHESTRATE_INSTANCE_METADATA`` names another metadata endpoint (tests run a fake one on
loopback; it also turns polling on for a CPU worker), or ``off`` turns polling off;
``ORCHESTRATE_SPOT_POLL_SECONDS`` sets the interval (default 5 s: a request every 5 s costs
nothing next to a step, and leaves nearly all of the two minutes for the save).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import torch

from workloads.core.logs import get_logger

METADATA_ENV = "ORCHESTRATE_INSTANCE_METADATA"
POLL_ENV = "ORCHESTRATE_SPOT_POLL_SECONDS"
METADATA_URL = "http://169.254.169.254"  # EC2's instance metadata service, link-local on every instance
POLL_SECONDS = 5.0
TOKEN_TTL_SECONDS = 21_600  # IMDSv2's longest session token
UNREACHABLE_TRIES = 3  # an endpoint never reached in this many polls is not there (not on EC2): stop asking
TIMEOUT_SECONDS = 2.0


class SpotNotice:
    """Polls the instance metadata for an interruption notice until :meth:`stop`.

    :meth:`pending` is true from the notice until :meth:`consume` (a save taken), once per
    notice: the instance is going, another save a minute later would only repeat it."""

    def __init__(self, endpoint: str = METADATA_URL, interval: float = POLL_SECONDS) -> None:
        self.endpoint, self.interval = endpoint.rstrip("/"), interval
        self.notice: dict | None = None
        self._announced, self._consumed, self._stopped = threading.Event(), threading.Event(), threading.Event()
        self._token: tuple[str, float] | None = None  # (token, when it was issued)
        self._thread: threading.Thread | None = None

    @classmethod
    def for_worker(cls, device: torch.device) -> SpotNotice | None:
        """A started poller for a worker on ``device``: GPU workers (the spot instances) poll EC2's
        endpoint; ``ORCHESTRATE_INSTANCE_METADATA`` names another (any device) or ``off``."""
        endpoint = os.environ.get(METADATA_ENV)
        if endpoint is not None and endpoint.strip().lower() in ("", "off", "none", "0", "false"):
            return None
        if endpoint is None and device.type != "cuda":
            return None
        notice = cls(endpoint or METADATA_URL, float(os.environ.get(POLL_ENV, POLL_SECONDS)))
        notice.start()
        return notice

    def start(self) -> None:
        self._thread = threading.Thread(target=self._poll, name="spot-notice", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def pending(self) -> bool:
        return self._announced.is_set() and not self._consumed.is_set()

    def consume(self) -> None:
        if self._announced.is_set():
            self._consumed.set()

    def wait(self, timeout: float) -> bool:
        """Block until a notice is seen (tests), at most ``timeout`` seconds."""
        return self._announced.wait(timeout)

    def _request(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return response.read()

    def _session_token(self) -> str:
        if self._token is None or time.monotonic() - self._token[1] > TOKEN_TTL_SECONDS - 60:
            token = self._request("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)})
            self._token = (token.decode().strip(), time.monotonic())
        return self._token[0]

    def check(self) -> dict | None:
        """One poll: the notice (``{"action": "terminate" | "stop" | "hibernate", "time": ...}``), or
        None while none is announced. Raises OSError when the endpoint cannot be reached."""
        try:
            body = self._request("GET", "/latest/meta-data/spot/instance-action",
                                 {"X-aws-ec2-metadata-token": self._session_token()})
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code == 401:  # the session token expired: a new one next time
                self._token = None
            raise
        try:
            return json.loads(body)
        except ValueError:
            return {"action": body.decode(errors="replace").strip()}

    def _poll(self) -> None:
        log, reached, failures = get_logger("train"), False, 0
        while not self._stopped.is_set():
            try:
                notice = self.check()
                reached, failures = True, 0
            except OSError as exc:  # URLError, HTTPError, timeouts: the service or the network
                failures += 1
                if not reached and failures >= UNREACHABLE_TRIES:
                    log.debug(f"no instance metadata at {self.endpoint} ({exc}): not polling for spot notices")
                    return
                notice = None
            if notice is not None:
                self.notice = notice
                self._announced.set()
                log.warning(f"spot interruption notice ({notice.get('action', '?')} at {notice.get('time', '?')}): "
                            "saving the training state after the current step")
                return
            self._stopped.wait(self.interval)


__all__ = ["METADATA_ENV", "POLL_ENV", "SpotNotice"]
