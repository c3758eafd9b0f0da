"""The full-disk test switch (workloads.core.paths.FULL_DISK_ENV) the chaos test injects with:
the N-th atomic write, counted across processes, fails with ENOSPC and leaves nothing behind."""

import errno

import pytest

from workloads.core.paths import FULL_DISK_ENV, atomic_path


def test_the_nth_atomic_write_meets_a_full_disk_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(FULL_DISK_ENV, f"{tmp_path / 'writes.count'}:2")
    out = tmp_path / "out"
    for name in ("first.json", "second.json", "third.json"):
        try:
            with atomic_path(out / name, ".json") as tmp:
                tmp.write_text(name)
        except OSError as exc:
            assert (name, exc.errno, exc.filename) == ("second.json", errno.ENOSPC, str(out / "second.json"))
    assert sorted(p.name for p in out.iterdir()) == ["first.json", "third.json"]  # no temporary folder left
    assert (out / "third.json").read_text() == "third.json"
    assert (tmp_path / "writes.count").read_text() == "3"


def test_without_the_switch_nothing_is_counted(tmp_path, monkeypatch):
    monkeypatch.delenv(FULL_DISK_ENV, raising=False)
    with atomic_path(tmp_path / "a.json") as tmp:
        tmp.write_text("a")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_full_disk_in_an_in_epoch_save_keeps_the_last_complete_state(tmp_path, monkeypatch):
    """An in-epoch save that meets a full disk raises and leaves the previous state where a
    restarted attempt looks (the half-written one only under .writing, replaced by the next save)."""
    import torch  # noqa: PLC0415

    from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE, InEpochCheckpoints  # noqa: PLC0415

    class Model:
        def save(self, directory):
            torch.save({"w": torch.zeros(1)}, directory / "model.pt")

    saves = InEpochCheckpoints(tmp_path / "in-epoch-checkpoint", 1, None)
    saves.save(Model(), {"epoch": 1, "step": 1}, rank=0, world=1)
    monkeypatch.setenv(FULL_DISK_ENV, f"{tmp_path / 'writes.count'}:1")
    with pytest.raises(OSError) as raised:
        saves.save(Model(), {"epoch": 1, "step": 2}, rank=0, world=1)
    assert raised.value.errno == errno.ENOSPC
    assert torch.load(tmp_path / "in-epoch-checkpoint" / STATE_FILE, weights_only=False)["step"] == 1
