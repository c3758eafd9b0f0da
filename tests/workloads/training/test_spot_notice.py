"""AWS's spot interruption notice: a fake instance-metadata service on loopback (IMDSv2: a token
by PUT, then the notice by GET, 404 while none) announces an interruption, and the running
trial saves its state after the step in flight; the restarted attempt continues from there."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE, InEpochCheckpoints
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.kinds.rerank.train import RerankEpochs, train_cross_encoder
from workloads.training.spot import METADATA_ENV, POLL_ENV, SpotNotice

TOKEN = "a-session-token"
NOTICE = {"action": "terminate", "time": "2026-11-27T05:30:00Z"}


class FakeMetadata(BaseHTTPRequestHandler):
    announced = threading.Event()
    requests: list = []

    def do_PUT(self):  # noqa: N802 (http.server's naming)
        self.requests.append(("PUT", self.path))
        if self.path != "/latest/api/token" or "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
            return self._answer(400, b"")
        self._answer(200, TOKEN.encode())

    def do_GET(self):  # noqa: N802
        self.requests.append(("GET", self.path))
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            return self._answer(401, b"")
        if self.path != "/latest/meta-data/spot/instance-action" or not self.announced.is_set():
            return self._answer(404, b"Not Found")
        self._answer(200, json.dumps(NOTICE).encode())

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture()
def metadata(monkeypatch):
    FakeMetadata.announced.clear()
    FakeMetadata.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv(METADATA_ENV, url)
    monkeypatch.setenv(POLL_ENV, "0.05")
    yield url
    server.shutdown()
    server.server_close()


def test_the_notice_is_read_with_a_session_token_and_none_is_a_404(metadata):
    notice = SpotNotice(metadata)
    assert notice.check() is None  # 404: nothing announced
    FakeMetadata.announced.set()
    assert notice.check() == NOTICE
    assert FakeMetadata.requests[0] == ("PUT", "/latest/api/token")
    assert FakeMetadata.requests.count(("PUT", "/latest/api/token")) == 1  # the token is kept for its lifetime
    assert not notice.pending()
    notice.start()
    assert notice.wait(5) and notice.pending() and notice.notice == NOTICE
    notice.consume()
    assert not notice.pending()  # one save per notice


def test_only_gpu_workers_poll_unless_an_endpoint_is_named(monkeypatch):
    monkeypatch.delenv(METADATA_ENV, raising=False)
    assert SpotNotice.for_worker(torch.device("cpu")) is None
    monkeypatch.setenv(METADATA_ENV, "off")
    assert SpotNotice.for_worker(torch.device("cuda", 0)) is None
    monkeypatch.setenv(METADATA_ENV, "http://127.0.0.1:9")  # nothing listens: the poller gives up by itself
    monkeypatch.setenv(POLL_ENV, "0.01")
    notice = SpotNotice.for_worker(torch.device("cpu"))
    notice._thread.join(10)
    assert not notice._thread.is_alive() and not notice.pending()


def test_a_spot_notice_makes_the_running_trial_save_after_the_current_step(tmp_path, metadata, monkeypatch,
                                                                          tiny_model_dir, scifact_dir):
    """No ``checkpoint_every``: the only in-epoch save is the notice's, after step 2 of epoch 1
    (announced during that step); the attempt then dies in step 3 and the restarted one
    continues at step 3, not at the epoch's start."""
    spec = TrialSpec.model_validate({
        "name": "spot", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 32, "seed": 3}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "optimization": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "precision": "fp32"},
    })
    training = prepare_trial(spec).training
    real_step, real_save, calls, saves = RerankEpochs._step, InEpochCheckpoints.save, [], []

    def step(self, micro, epoch, step_number, parts):
        calls.append((epoch, step_number))
        if (epoch, step_number) == (1, 2):  # the notice comes during step 2
            FakeMetadata.announced.set()
            assert self.in_epoch.notice.wait(5)
        if (epoch, step_number) == (1, 3):
            raise RuntimeError("the instance was reclaimed")
        return real_step(self, micro, epoch, step_number, parts)

    def save(self, model, state, rank, world):
        saves.append((state["epoch"], state["step"]))
        return real_save(self, model, state, rank, world)

    monkeypatch.setattr(RerankEpochs, "_step", step)
    monkeypatch.setattr(InEpochCheckpoints, "save", save)
    in_epoch = tmp_path / "in-epoch"
    with pytest.raises(RuntimeError, match="reclaimed"):
        train_cross_encoder(spec, training, lambda metrics, checkpoint: None, in_epoch_dir=in_epoch)
    assert saves == [(1, 2)]
    state = torch.load(in_epoch / STATE_FILE, weights_only=False)
    assert (state["epoch"], state["step"]) == (1, 2)
    FakeMetadata.announced.clear()  # the restarted attempt runs on another node
    calls.clear()
    monkeypatch.setattr(RerankEpochs, "_step", lambda self, *a: calls.append(a[1:3]) or real_step(self, *a))
    reports = []
    train_cross_encoder(spec, training, lambda metrics, checkpoint: reports.append(metrics), in_epoch_dir=in_epoch)
    assert calls == [(1, 3), (1, 4)] and [m["epoch"] for m in reports] == [1]
    assert saves == [(1, 2)] and not in_epoch.exists()
