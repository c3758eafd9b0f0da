"""`orchestrate run` at the default level: the project's lines on the terminal, Ray's and Ray
Train's own lines in run.log (orchestrator.core.ray_output), given batches as Ray's log thread
hands them to the handler it registers for forwarded worker lines."""

import io
import logging
import sys
import threading

import pytest

from orchestrator.core import ray_output
from orchestrator.core.ray_output import WorkerLines, ray_output_to
from workloads.core.errors import InputError
from workloads.core.logs import configure

pytest.importorskip("ray")


def batch(lines, pid=32439, actor_name="RayTrainWorker", ip="10.0.0.1", is_err=True, **extra):
    return {"ip": ip, "localhost": "10.0.0.1", "pid": pid, "actor_name": actor_name, "task_name": "",
            "is_err": is_err, "job": "01000000", "lines": lines, **extra}


PROGRESS = "[train] epoch 1/2 [#####-----]  25% step 1/4 loss 0.7175"
REPORT = "Reporting training result 1: TrainingReport(checkpoint=None, metrics={'epoch': 1}, validation=False) from rank 0"
CORE_WORKER = "[2026-12-04 23:44:21,950 E 32095 32293] core_worker.cc:2465: Actor"


@pytest.fixture
def project_log():
    stream = io.StringIO()
    configure("INFO", stream)
    yield stream
    configure("INFO", sys.stderr)


def test_project_lines_reach_the_terminal_without_ray_s_prefix_ray_s_lines_the_file():
    terminal, sink = io.StringIO(), io.StringIO()
    workers = WorkerLines(sink, terminal)
    workers(batch([PROGRESS, REPORT]))
    workers(batch(["[score] test: 1,500/1,500 pairs", "Traceback (most recent call last):"], pid=662, actor_name="",
                  task_name="task", ip="10.0.0.2", is_err=False))
    workers(batch([CORE_WORKER], pid=32095, actor_name="TrainController"))
    workers.flush()
    assert terminal.getvalue() == f"{PROGRESS}\n[score] test: 1,500/1,500 pairs\n"
    assert sink.getvalue() == (f"(RayTrainWorker pid=32439) {REPORT}\n"
                               "(task pid=662, ip=10.0.0.2) Traceback (most recent call last):\n"
                               f"(TrainController pid=32095) {CORE_WORKER}\n")


def test_the_node_s_own_warnings_stay_on_the_terminal():
    terminal, sink = io.StringIO(), io.StringIO()
    WorkerLines(sink, terminal)(batch(["A worker died or was killed while executing a task"], pid="raylet", actor_name=""))
    # as Ray prints them itself (its colour for the node's warnings)
    assert terminal.getvalue() == "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task\n"
    assert sink.getvalue() == ""


class ReenteringTerminal(io.StringIO):
    """A terminal whose first write hands the handler another batch (as a logging handler on the
    same stream would write while the first write is under way)."""

    def __init__(self):
        super().__init__()
        self.workers = None

    def write(self, text):
        workers, self.workers = self.workers, None
        if workers is not None:
            workers(batch(["[train] written from inside a write"], pid=7))
        return super().write(text)


def test_a_write_that_comes_back_into_the_handler_does_not_wait_on_it():
    terminal, sink = ReenteringTerminal(), io.StringIO()
    workers = WorkerLines(sink, terminal)
    terminal.workers = workers
    thread = threading.Thread(target=workers, args=(batch([PROGRESS]),), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the handler waited on itself"
    assert terminal.getvalue() == f"[train] written from inside a write\n{PROGRESS}\n"


def test_the_block_sends_ray_s_driver_loggers_below_warnings_to_the_file_and_gives_them_back(tmp_path, project_log):
    import ray  # noqa: F401 - (the block routes Ray's loggers once Ray is imported)

    probe = logging.getLogger("ray.probe_of_the_test")
    console = logging.StreamHandler(io.StringIO())
    probe.addHandler(console)
    try:
        with ray_output_to(tmp_path / "ray" / "run.log"):
            ray_output.attach()  # as init_ray does before ray.init
            probe.info("Started a local Ray instance")
            probe.warning("the dashboard did not start")
        assert console.level == logging.NOTSET and probe.handlers == [console]
    finally:
        probe.removeHandler(console)
    assert console.stream.getvalue() == "the dashboard did not start\n"
    logged = (tmp_path / "ray" / "run.log").read_text()
    assert "INFO" in logged and "-- Started a local Ray instance" in logged and "-- the dashboard did not start" in logged
    assert project_log.getvalue() == (f"[run] Ray's and Ray Train's own output goes to {tmp_path / 'ray' / 'run.log'} "
                                      "(-v shows it here)\n")


def test_an_unexpected_error_says_where_ray_s_output_is_and_bad_input_does_not(tmp_path, project_log):
    import ray  # noqa: F401

    where = f"[run] error: Ray's own output, with any worker's traceback, is in {tmp_path / 'run.log'}\n"
    with pytest.raises(RuntimeError), ray_output_to(tmp_path / "run.log"):
        ray_output.attach()
        raise RuntimeError("a worker failed")
    assert project_log.getvalue().endswith(where)
    with pytest.raises(InputError), ray_output_to(tmp_path / "run.log"):
        ray_output.attach()
        raise InputError("trial.yaml", "bad")
    with pytest.raises(ValueError), ray_output_to(tmp_path / "run.log", lambda exc: isinstance(exc, ValueError)):
        ray_output.attach()
        raise ValueError("a worker's bad input, under Ray's wrappers")
    assert project_log.getvalue().count(where) == 1  # (bad input is the command's one line: nothing more)


def test_verbose_routes_nothing_and_a_run_that_never_starts_ray_writes_no_file(tmp_path, project_log):
    import ray  # noqa: F401 - imported, not started

    with ray_output_to(None):
        ray_output.attach()
    with ray_output_to(tmp_path / "run.log"):  # a trial reused, or bad input before Ray starts
        pass
    assert not list(tmp_path.iterdir()) and project_log.getvalue() == ""


def test_a_handler_on_two_of_ray_s_loggers_gets_its_own_level_back(tmp_path):
    # (pytest's own capture handler sits on several loggers at once: left at WARNING, every later test's
    # records at INFO were lost)
    import ray  # noqa: F401

    shared = logging.StreamHandler(io.StringIO())
    loggers = [logging.getLogger("ray.probe_one"), logging.getLogger("ray.probe_two")]
    for logger in loggers:
        logger.addHandler(shared)
    try:
        with ray_output_to(tmp_path / "run.log"):
            ray_output.attach()
            assert shared.level == logging.WARNING
        assert shared.level == logging.NOTSET
    finally:
        for logger in loggers:
            logger.removeHandler(shared)
