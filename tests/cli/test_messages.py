"""Messages read exactly (issue 59): a kind a file names that no kind is, a trial file given to a
command that takes a sweep file."""

import pytest
import yaml

from tests.helpers import run_cli


def error_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_a_trial_kind_in_the_wrong_case_is_named_unknown_with_the_kinds_and_the_right_spelling(tmp_path):
    (tmp_path / "t.yaml").write_text("name: t\nkind: Dense\ndata: {collection: beir/scifact}\nmodel: {towers: shared}\n")
    assert error_line(run_cli(tmp_path, "run", "t.yaml", "--dry-run")) == (
        "error: t.yaml:2: kind: unknown trial kind 'Dense' (a file names kind: dense, ear; a re-ranking trial names none): "
        "did you mean 'dense'?")


def test_a_sweeps_base_kind_that_is_no_kind_is_named_unknown(tmp_path):
    sweep = {"name": "s", "base": {"kind": "colbert", "data": {"collection": "beir/scifact"}}, "grid": {"models": ["m"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    assert error_line(run_cli(tmp_path, "sweep", "s.yaml", "--dry-run")) == (
        "error: s.yaml:3: base.kind: unknown trial kind 'colbert' (a file names kind: dense, ear; a re-ranking trial "
        "names none)")


@pytest.mark.parametrize("command", ["report", "status"])
def test_a_trial_file_given_to_a_sweep_command_says_so(tmp_path, command):
    trial = {"name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(trial))
    assert error_line(run_cli(tmp_path, command, "t.yaml")) == (
        f"error: t.yaml: a trial file, not a sweep file (it has no grid): `orchestrate {command}` takes a sweep file "
        "(name, base, grid, search); `orchestrate run` runs a trial file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]  # nothing written
