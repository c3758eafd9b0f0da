"""`orchestrate run` at the default level: the project's lines on the terminal, Ray's and Ray
Train's own lines (as Ray prints them) in the log file (orchestrator.core.ray_output)."""

import io
import logging
import sys

import pytest

from orchestrator.core.ray_output import RayOutput, ray_output_to
from workloads.core.errors import InputError
from workloads.core.logs import configure

# as Ray prints forwarded worker lines: coloured (the default) or not (RAY_COLOR_PREFIX=0), on another node
WORKER_PROGRESS = "\x1b[36m(RayTrainWorker pid=32439)\x1b[0m [train] epoch 1/2 [#####-----]  25% step 1/4 loss 0.7175"
TASK_PROGRESS = "(task pid=662, ip=10.0.0.2) [score] test: 1,500/1,500 pairs (386.4 pairs/s)"
TRAIN_REPORT = ("\x1b[36m(RayTrainWorker pid=32463)\x1b[0m Reporting training result 1: TrainingReport(checkpoint=None, "
                "metrics={'epoch': 1, 'train_loss': 0.70}, validation=False)")
RAYLET = "\x1b[36m(TrainController pid=32095)\x1b[0m [2026-12-04 23:44:21,950 E 32095 32293] core_worker.cc:2465: Actor"


@pytest.fixture(autouse=True)
def ray_left_running(monkeypatch):  # (the block ends Ray's session: not a Ray another test of this process uses)
    monkeypatch.setattr("orchestrator.core.ray_output._shutdown_ray", lambda: None)


@pytest.fixture
def project_log():
    stream = io.StringIO()
    configure("INFO", stream)
    yield stream
    configure("INFO", sys.stderr)


def test_a_worker_s_project_lines_reach_the_terminal_without_ray_s_prefix_the_rest_the_file(tmp_path, project_log):
    terminal = io.StringIO()
    output = RayOutput(tmp_path / "ray" / "run.log", terminal)
    for line in (WORKER_PROGRESS, TRAIN_REPORT, TASK_PROGRESS, RAYLET):
        output.write(line[:20])  # print() writes a line in pieces
        output.write(line[20:] + "\n")
    output.write("Traceback (most recent call last):\n  ray.exceptions.GetTimeoutError: Get timed out\n")
    output.close_log()
    assert terminal.getvalue() == ("[train] epoch 1/2 [#####-----]  25% step 1/4 loss 0.7175\n"
                                   "[score] test: 1,500/1,500 pairs (386.4 pairs/s)\n")
    assert (tmp_path / "ray" / "run.log").read_text() == (f"{TRAIN_REPORT}\n{RAYLET}\nTraceback (most recent call last):\n"
                                                          "  ray.exceptions.GetTimeoutError: Get timed out\n")
    assert project_log.getvalue() == f"[run] Ray's own output goes to {tmp_path / 'ray' / 'run.log'} (-v shows it here)\n"


def test_no_log_file_while_ray_printed_only_the_project_s_lines(tmp_path, project_log):
    terminal = io.StringIO()
    output = RayOutput(tmp_path / "run.log", terminal)
    output.write(WORKER_PROGRESS + "\n")
    output.close_log()
    assert not (tmp_path / "run.log").exists() and project_log.getvalue() == ""


def test_the_block_sends_ray_s_loggers_and_printed_lines_to_the_file_and_gives_them_back(tmp_path, project_log):
    ray_logger = logging.getLogger("ray.probe")
    terminal_handler = logging.StreamHandler(sys.stderr)
    ray_logger.addHandler(terminal_handler)
    try:
        with ray_output_to(tmp_path / "run.log"):
            print(TRAIN_REPORT, file=sys.stderr)
            print(WORKER_PROGRESS)  # Ray prints a worker's stdout on the driver's
            ray_logger.warning("Connecting to existing Ray cluster")
        assert terminal_handler.stream is sys.stderr
    finally:
        ray_logger.removeHandler(terminal_handler)
    assert (tmp_path / "run.log").read_text() == f"{TRAIN_REPORT}\nConnecting to existing Ray cluster\n"


def test_verbose_leaves_everything_on_the_terminal(tmp_path, capsys):
    with ray_output_to(None):
        print(TRAIN_REPORT, file=sys.stderr)
    assert TRAIN_REPORT in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_an_unexpected_error_says_where_ray_s_output_is_and_bad_input_does_not(tmp_path, project_log):
    where = f"[run] error: Ray's own output, with any worker's traceback, is in {tmp_path / 'run.log'}\n"
    with pytest.raises(RuntimeError), ray_output_to(tmp_path / "run.log"):
        print("Traceback (most recent call last): ...", file=sys.stderr)
        raise RuntimeError("a worker failed")
    assert project_log.getvalue().endswith(where)
    with pytest.raises(InputError), ray_output_to(tmp_path / "run.log"):
        print("Traceback (most recent call last): ...", file=sys.stderr)
        raise InputError("trial.yaml", "bad")
    assert project_log.getvalue().count(where) == 1  # (bad input is the command's one line: nothing more)
