"""SIR: eq. 1 and listwise softmax by hand, both CPR forms, selection, the curriculum's loss
per variant against hand computations, and the clear error of a step that does not fit."""

import math
import shutil

import pyarrow.parquet as pq
import pytest
import torch

import workloads.training as training
import workloads.training.step as step
from orchestrator.sweep.tune import _is_out_of_memory
from workloads.kinds import choose_epoch
from workloads.kinds import run_in_process as run_trial_in_process
from workloads.kinds.rerank.batching import lists_to_batch
from workloads.kinds.rerank.sir import compress_blocks, compressed_rows, conditional_log_probs, curriculum_loss, select_survivors
from workloads.kinds.rerank.spec import SIRSpec, TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.kinds.rerank.train import train_cross_encoder
from workloads.losses import ModelOutputs, build_ranking_loss
from workloads.models.cross_encoder import CrossEncoder, score_pairs

SCORES = [2.0, 1.0, 3.0, -1.0]  # one block: the positive first, then three negatives


def softmax(values):
    total = sum(math.exp(v) for v in values)
    return [math.exp(v) / total for v in values]


def eq1(p):
    return -math.log(p[0]) - sum(math.log(1 - q) for q in p[1:])


def block_batch(negatives_per_block=(3,)):
    rows = [{"query_id": f"q{b}", "query": f"q{b}", "positive_id": f"p{b}", "positive": "p", "negative_id": "n0",
             "negative": "n", "negative_ids": [f"n{j}" for j in range(n)], "negatives": ["n"] * n}
            for b, n in enumerate(negatives_per_block)]
    return lists_to_batch(rows)


def test_sir_eq_1_and_listwise_softmax_against_hand_values():
    structure = block_batch().structure
    outputs = ModelOutputs(torch.tensor(SCORES), torch.zeros(4, 2))
    p = softmax(SCORES)
    assert build_ranking_loss("sir")(outputs, structure).item() == pytest.approx(eq1(p), rel=1e-6)
    assert build_ranking_loss("sir")(outputs, structure).item() == pytest.approx(2.5954, abs=5e-4)  # 1.4196 + 0.0931 + 1.0706 + 0.0121
    assert build_ranking_loss("listwise")(outputs, structure).item() == pytest.approx(-math.log(p[0]), rel=1e-6)
    # eq. 1 is not listwise cross-entropy: it also pushes each negative down
    assert build_ranking_loss("sir")(outputs, structure).item() > build_ranking_loss("listwise")(outputs, structure).item()


def test_both_cpr_forms_against_hand_values_and_the_default_is_eq_2_at_level_1():
    level1 = torch.log_softmax(torch.tensor([2.0, 1.0, 3.0]), 0)
    level2 = torch.log_softmax(torch.tensor([0.5, -0.5, 1.5]), 0)
    p1, p2 = softmax([2.0, 1.0, 3.0]), softmax([0.5, -0.5, 1.5])
    product = [a * b for a, b in zip(p1, p2)]
    normalized = [x / sum(product) for x in product]
    assert conditional_log_probs([level1, level2]).exp().tolist() == pytest.approx(normalized, rel=1e-6)
    assert conditional_log_probs([level1, level2], "literal").exp().tolist() == pytest.approx(softmax(product), rel=1e-6)
    assert conditional_log_probs([level1]).exp().tolist() == pytest.approx(p1, rel=1e-6)  # = eq. 2 at level 1
    assert conditional_log_probs([level1], "literal").exp().tolist() != pytest.approx(p1, rel=1e-3)  # eq. 7 as printed is not


def test_selection_keeps_the_positive_first_and_the_top_negatives_ties_by_position():
    scores = torch.tensor([0.0, 1.0, 5.0, 3.0, 5.0, 3.0])
    assert select_survivors(scores, 3).tolist() == [0, 2, 4]        # the two 5s
    assert select_survivors(scores, 4).tolist() == [0, 2, 3, 4]     # the 3s tie: the earlier one (3) wins
    assert select_survivors(torch.tensor([9.0, 1.0]), 5).tolist() == [0, 1]  # fewer negatives than asked: all
    first = select_survivors(scores, 3, "random", torch.Generator().manual_seed(4)).tolist()
    assert first == select_survivors(scores, 3, "random", torch.Generator().manual_seed(4)).tolist()
    draws = {tuple(select_survivors(scores, 3, "random", torch.Generator().manual_seed(s)).tolist()) for s in range(30)}
    assert len(draws) > 3 and all(d[0] == 0 and len(d) == 3 for d in draws)


def _rescorer(second):
    """Level 2 re-scores survivors with these scores (by pair index): a stand-in network."""
    return lambda index: torch.tensor([second[i] for i in index.tolist()])


def test_the_curriculum_loss_per_variant_by_hand():
    structure = block_batch().structure
    first = torch.tensor(SCORES)
    second = {0: 0.5, 1: 0.0, 2: 1.5, 3: 9.0}  # pair 3 (-1.0) is dropped at level 2: its score must not matter
    spec = lambda variant, **kw: SIRSpec(variant=variant, levels=[3], **kw)  # noqa: E731  1 + 3 -> 3
    # level 2 keeps the positive and the two hardest negatives: pairs 0, 2 (3.0) and 1 (1.0), in block order
    survivors_first = softmax([SCORES[0], SCORES[1], SCORES[2]])
    survivors_second = softmax([second[0], second[1], second[2]])
    l1 = eq1(softmax(SCORES))
    assert curriculum_loss(_rescorer(second), first, structure, spec("v0"), "sir").item() == pytest.approx(l1, rel=1e-6)
    v3 = curriculum_loss(_rescorer(second), first, structure, spec("v3"), "sir").item()
    assert v3 == pytest.approx(l1 + eq1(survivors_second), rel=1e-5)
    p1_of_survivors = [softmax(SCORES)[i] for i in (0, 1, 2)]
    cpr2 = [a * b for a, b in zip(p1_of_survivors, survivors_second)]
    v4 = curriculum_loss(_rescorer(second), first, structure, spec("v4"), "sir").item()
    assert v4 == pytest.approx(l1 + eq1([x / sum(cpr2) for x in cpr2]), rel=1e-5)
    reuse = curriculum_loss(_rescorer(second), first, structure, spec("v3", per_level_forward=False), "sir").item()
    assert reuse == pytest.approx(l1 + eq1(survivors_first), rel=1e-5)
    listwise = curriculum_loss(_rescorer(second), first, structure, spec("v3"), "listwise").item()
    assert listwise == pytest.approx(-math.log(softmax(SCORES)[0]) - math.log(survivors_second[0]), rel=1e-6)


def _levels_rescorer(levels):
    """Each later level re-scores its survivors with its own scores (by pair index), in order."""
    calls = iter(levels)

    def score(index):
        level = next(calls)
        return torch.tensor([level[i] for i in index.tolist()])

    return score


def test_the_curriculum_loss_over_four_levels_with_survivors_out_of_position():
    """1 + 5 -> 4 -> 3 -> 2: the survivors of each level are not its first entries, so a
    conditional probability aligned by position instead of by pair, a V3 that sums every
    level instead of L_1 + L_M, and a V4 that sums only the first and last levels all differ
    from these hand values."""
    structure = block_batch((5,)).structure
    level1 = [1.0, 0.5, 3.0, -1.0, 2.0, 0.0]          # pairs 0 (positive) .. 5
    # level 2 keeps the positive and the 3 hardest: pairs 2 (3.0), 4 (2.0), 1 (0.5): [0, 1, 2, 4]
    level2 = {0: 0.2, 1: 2.5, 2: -0.5, 4: 1.0}       # level 3 keeps pairs 1 (2.5) and 4 (1.0): [0, 1, 4]
    level3 = {0: 1.0, 1: 0.0, 4: 2.0}                # level 4 keeps pair 4: [0, 4]
    level4 = {0: 0.3, 4: -0.2}
    survivors = [[0, 1, 2, 3, 4, 5], [0, 1, 2, 4], [0, 1, 4], [0, 4]]
    scores = [dict(enumerate(level1)), level2, level3, level4]
    p = [dict(zip(ids, softmax([level[i] for i in ids]))) for ids, level in zip(survivors, scores)]
    terms = [eq1([p[i][j] for j in ids]) for i, ids in enumerate(survivors)]

    def cpr(i):  # level i's conditional probabilities: the product of every level's P of the same pairs
        product = [math.prod(p[level][j] for level in range(i + 1)) for j in survivors[i]]
        return [x / sum(product) for x in product]

    def loss(variant, ranking="sir"):
        spec = SIRSpec(variant=variant, levels=[4, 3, 2])
        return curriculum_loss(_levels_rescorer(scores[1:]), torch.tensor(level1), structure, spec, ranking).item()

    assert loss("v0") == pytest.approx(terms[0], rel=1e-6)
    assert loss("v3") == pytest.approx(terms[0] + terms[3], rel=1e-5)
    assert loss("v4") == pytest.approx(sum(eq1(cpr(i)) for i in range(4)), rel=1e-5)
    assert loss("v3", "listwise") == pytest.approx(-math.log(p[0][0]) - math.log(p[3][0]), rel=1e-5)
    # the three readings the audit's mutants took are far from these values
    assert abs(loss("v3") - sum(terms)) > 0.1
    assert abs(loss("v4") - eq1(cpr(0)) - eq1(cpr(3))) > 0.1
    by_position = [softmax(level1)[:4][k] * p[1][j] for k, j in enumerate(survivors[1])]  # P_1 of positions 0-3
    assert abs(eq1(cpr(1)) - eq1([x / sum(by_position) for x in by_position])) > 0.01


def test_the_curriculum_reaches_the_network_through_every_level():
    structure = block_batch((3, 3)).structure
    weight = torch.tensor(1.0, requires_grad=True)
    raw = torch.tensor([2.0, 1.0, 3.0, -1.0, 0.0, 2.0, 1.0, 0.5])
    loss = curriculum_loss(lambda index: weight * raw[index] * 0.5, weight * raw, structure, SIRSpec(variant="v4", levels=[3, 2]), "sir")
    loss.backward()
    assert torch.isfinite(loss) and weight.grad is not None and weight.grad.abs() > 0


def test_sir_settings_are_checked():
    def spec(sir, **sections):
        base = {"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}, "loss": {"ranking": "sir"},
                "training_data": {"negatives": 7, "size": 800}, "optimization": {"batching": "per_query", "batch_size": 16}}
        return TrialSpec.model_validate({**base, **sections, "sir": sir})

    assert spec({"variant": "v4", "levels": [4, 2]}).sir.cpr == "normalized_product"
    with pytest.raises(ValueError, match="levels must shrink"):
        spec({"variant": "v3", "levels": [4, 4]})
    with pytest.raises(ValueError, match="must start below the block size 1 \\+ training_data.negatives = 8"):
        spec({"variant": "v3", "levels": [8, 4]})
    with pytest.raises(ValueError, match="ranking loss sir or listwise"):
        spec({"variant": "v3", "levels": [4]}, loss={"ranking": "pointwise"})
    with pytest.raises(ValueError, match="set optimization.batching per_query"):
        spec({"variant": "v3", "levels": [4]}, optimization={"batch_size": 16}, training_data={"size": 800})
    with pytest.raises(ValueError, match="cpr has no effect"):
        spec({"variant": "v3", "levels": [4], "cpr": "literal"})


def test_a_step_that_does_not_fit_names_the_settings_to_change(tmp_path, tiny_model_dir, scifact_dir, monkeypatch):
    spec = TrialSpec.model_validate({
        "name": "oom", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"negatives": 7, "size": 64}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "loss": {"ranking": "sir"}, "optimization": {"batching": "per_query", "batch_size": 16},
        "sir": {"variant": "v3", "levels": [4, 2]}})
    prepared = prepare_trial(spec)

    def too_big(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(step, "accumulated_step", too_big)
    with pytest.raises(training.StepOutOfMemoryError, match=r"lower optimization.batch_size .* or training_data.negatives "
                                                        r"\(block size\), set optimization.gradient_checkpointing: true"):
        train_cross_encoder(spec, prepared.training, lambda *a: None)

    assert issubclass(training.StepOutOfMemoryError, MemoryError) and _is_out_of_memory(training.StepOutOfMemoryError("x"))


def test_offline_selection_keeps_the_top_negatives_of_the_current_ones_by_original_position():
    rows = [{"query": "q0", "positive": "p", "negatives": ["a", "b", "c", "d", "e"], "negative_ids": list("ABCDE")},
            {"query": "q1", "positive": "p", "negatives": ["a", "b", "c"], "negative_ids": list("ABC")}]
    value = {"p": 0.0, "a": 1.0, "b": 4.0, "c": 2.0, "d": 4.0, "e": 3.0}
    calls = []

    def score(queries, documents):
        calls.append(len(documents))
        return [value[d] for d in documents]

    # row 0 currently holds its negatives 0, 1, 3, 4 (a, b, d, e): keep 2 -> b and d (a tie: both 4)
    assert compress_blocks(score, rows, [[0, 1, 3, 4], [0, 1, 2]], 3, "top", 13, 1) == [[1, 3], [1, 2]]
    assert calls == [5 + 4]  # every block's positive and current negatives, in one scoring call
    compressed = compressed_rows(rows, [[1, 3], [2]])
    assert (compressed[0]["negatives"], compressed[0]["negative_ids"], compressed[1]["negatives"]) == (["b", "d"], ["B", "D"], ["c"])
    assert compressed_rows(rows, None) is rows


def test_random_offline_selection_is_seeded_per_row_not_per_shard():
    rows = [{"query": f"q{i}", "positive": "p", "negatives": [f"n{j}" for j in range(9)]} for i in range(6)]
    kept = [list(range(9)) for _ in rows]

    def score(queries, documents):
        return [0.0] * len(documents)

    whole = compress_blocks(score, rows, kept, 4, "random", 13, 1)
    assert whole == compress_blocks(score, rows, kept, 4, "random", 13, 1)
    assert whole != compress_blocks(score, rows, kept, 4, "random", 14, 1)
    assert all(len(k) == 3 and k == sorted(k) for k in whole)
    odd = compress_blocks(score, rows[1::2], kept[1::2], 4, "random", 13, 1, row_numbers=[1, 3, 5])
    assert odd == whole[1::2]  # what a worker with every other row selects


def _staged_spec(tiny_model_dir, variant: str, epochs: int = 1):
    return TrialSpec.model_validate({
        "name": f"sir-{variant}", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 20, "validation_depth": 5, "test_depth": 3},
        "training_data": {"negatives": 7, "size": 32}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "loss": {"ranking": "sir"}, "optimization": {"batching": "per_query", "batch_size": 16, "learning_rate": 1e-3,
                                                     "epochs": epochs},
        "sir": {"variant": variant, "levels": [4, 2], "selection": "random"}})


def _train_recording(spec, prepared, monkeypatch, tmp_path, resume_from=None, stop_after: int | None = None):
    """Train in-process; returns the weights each stage's objective had at its first step,
    every epoch's metrics, and a copy of every checkpoint (raises after ``stop_after``)."""
    first_weights, reports = {}, []
    real_step = step.accumulated_step

    def recording_step(wrapped, objective, *args, **kwargs):
        first_weights.setdefault(id(objective), {k: v.detach().clone() for k, v in objective.model.state_dict().items()})
        return real_step(wrapped, objective, *args, **kwargs)

    def report(metrics, checkpoint):
        kept = tmp_path / f"epoch-{int(metrics['epoch'])}"
        shutil.copytree(checkpoint, kept, dirs_exist_ok=True)
        reports.append((dict(metrics), kept))
        if stop_after is not None and metrics["epoch"] == stop_after:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(step, "accumulated_step", recording_step)
    try:
        train_cross_encoder(spec, prepared.training, report, resume_from=resume_from)
    except KeyboardInterrupt:
        pass
    return list(first_weights.values()), reports


def _weights(checkpoint):
    return CrossEncoder.from_pretrained(str(checkpoint), 64).state_dict()


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_staged_variants_start_each_compressor_from_the_right_weights(tmp_path, tiny_model_dir, scifact_dir, monkeypatch,
                                                                      variant):
    spec = _staged_spec(tiny_model_dir, variant)
    starts, reports = _train_recording(spec, prepare_trial(spec), monkeypatch, tmp_path)
    assert [(m["epoch"], m["stage"]) for m, _ in reports] == [(1, 1), (2, 2), (3, 3)]  # 1 + len(levels) stages
    assert "epoch_selection_seconds" in reports[0][0] and "epoch_selection_seconds" not in reports[2][0]
    assert len(starts) == 3
    stage1_end = _weights(reports[0][1])
    assert not _same(starts[0], stage1_end)  # stage 1 trained
    if variant == "v1":   # every compressor from the pretrained weights (the same initialisation)
        assert _same(starts[1], starts[0]) and _same(starts[2], starts[0])
    else:                 # C_2 from C_1's final weights, C_3 from C_2's
        assert _same(starts[1], stage1_end) and _same(starts[2], _weights(reports[1][1]))
    state = torch.load(reports[0][1] / "training_state.pt", weights_only=False)
    assert state["kept"] is None and all(len(k) == 3 for k in state["next_kept"])  # levels[0] = 4: 3 negatives
    later = torch.load(reports[1][1] / "training_state.pt", weights_only=False)
    assert later["kept"] == state["next_kept"]
    assert all(len(k) == 1 and set(k) <= set(parent) for k, parent in zip(later["next_kept"], later["kept"]))
    # the last compressor is the model that is tested, whatever stage 1 validated
    metrics = [m for m, _ in reports]
    metrics[0]["val_ndcg_at_10"] = 1.0
    assert choose_epoch(metrics) == 2


def test_a_v1_trial_killed_in_stage_2_resumes_in_stage_2(tmp_path, tiny_model_dir, scifact_dir, monkeypatch):
    spec = _staged_spec(tiny_model_dir, "v1", epochs=2)
    prepared = prepare_trial(spec)
    starts, first = _train_recording(spec, prepared, monkeypatch, tmp_path / "a", stop_after=3)
    assert [(m["epoch"], m["stage"]) for m, _ in first] == [(1, 1), (2, 1), (3, 2)]
    stage2_blocks = torch.load(first[-1][1] / "training_state.pt", weights_only=False)["kept"]
    resumed_starts, rest = _train_recording(spec, prepared, monkeypatch, tmp_path / "b", resume_from=first[-1][1])
    assert [(m["epoch"], m["stage"]) for m, _ in rest] == [(4, 2), (5, 3), (6, 3)]  # stage 2 goes on, not over
    assert _same(resumed_starts[0], _weights(first[-1][1]))  # from the epoch-3 weights, not the pretrained ones
    assert torch.load(rest[0][1] / "training_state.pt", weights_only=False)["kept"] == stage2_blocks
    assert _same(resumed_starts[1], starts[0])  # stage 3 (v1): the pretrained weights again
    # a checkpoint at the end of stage 1 starts stage 2 from the pretrained weights and C_1's selection
    from_end, rest2 = _train_recording(spec, prepared, monkeypatch, tmp_path / "c", resume_from=first[1][1], stop_after=3)
    assert [(m["epoch"], m["stage"]) for m, _ in rest2] == [(3, 2)] and _same(from_end[0], starts[0])
    assert torch.load(rest2[0][1] / "training_state.pt", weights_only=False)["kept"] == stage2_blocks


def test_tiny_sir_trials_in_process_tell_the_variants_apart(tmp_path, tiny_model_dir, scifact_dir, monkeypatch):
    """V0, V3 and V4 from the same initial weights, seed and first batch: level 1's forward is
    the same in all three (same dropout draws), so the first step's loss is L_1 for V0 and
    L_1 plus a positive term for V3 (L_M) and V4 (every later level's CPR term), and V3 and V4
    differ."""
    first_loss = {}
    real_step = step.accumulated_step

    def recording_step(*args, **kwargs):
        loss = real_step(*args, **kwargs)
        first_loss.setdefault(variant, float(loss))
        return loss

    monkeypatch.setattr(step, "accumulated_step", recording_step)
    for variant in ("v0", "v3", "v4"):
        spec = TrialSpec.model_validate({
            "name": f"sir-{variant}", "data": {"collection": "beir/scifact", "validation_queries": 5},
            "first_stage": {"train_depth": 20, "validation_depth": 5, "test_depth": 3},
            "training_data": {"negatives": 7, "size": 32}, "model": {"name": str(tiny_model_dir), "max_length": 64},
            "loss": {"ranking": "sir"}, "optimization": {"batching": "per_query", "batch_size": 16, "learning_rate": 1e-3,
                                                         "gradient_checkpointing": variant == "v4"},
            "sir": {"variant": variant, "levels": [4, 2]}})
        _, records, tested = run_trial_in_process(spec, tmp_path / variant)
        assert math.isfinite(records[0].metrics["train_loss"]) and records[0].metrics["train_loss"] > 0
        assert tested.evaluation.num_queries == 300
    assert first_loss["v3"] > first_loss["v0"] + 1e-3 and first_loss["v4"] > first_loss["v0"] + 1e-3
    assert abs(first_loss["v4"] - first_loss["v3"]) > 1e-3


def test_a_trained_compressor_chooses_the_next_stage_by_its_own_scores(tmp_path, tiny_model_dir, scifact_dir, monkeypatch):
    """V2 with top selection: the negatives kept for stage 2 are, per row, the ones the stage-1
    compressor (its checkpoint, eval mode) scores highest, not a random draw."""
    spec = _staged_spec(tiny_model_dir, "v2")
    spec = spec.model_copy(update={"sir": spec.sir.model_copy(update={"selection": "top"})})
    prepared = prepare_trial(spec)
    _, reports = _train_recording(spec, prepared, monkeypatch, tmp_path, stop_after=1)
    kept = torch.load(reports[0][1] / "training_state.pt", weights_only=False)["next_kept"]
    compressor = CrossEncoder.from_pretrained(str(reports[0][1]), 64).eval()

    rows = pq.read_table(prepared.training.training_set).to_pylist()
    assert len(kept) == len(rows)
    for row, survivors in zip(rows, kept):
        # under the trial's precision: `auto` is bf16 on a CPU that has it, where fp32's order differs
        scores = score_pairs(compressor, [row["query"]] * len(row["negatives"]), row["negatives"], 64,
                             torch.device("cpu"), precision=spec.optimization.precision)
        top = sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:3]  # levels[0] = 4: the positive + 3
        assert survivors == sorted(top)


def test_random_selection_seeds_do_not_collide_past_ten_thousand_rows():
    """Seeded once as seed * 1_000_003 + stage * 10_007 + row, row 10,007 of stage 0 drew exactly
    what row 0 of stage 1 drew (MS MARCO has 367k rows); a hash of the tuple draws independently."""
    row = {"query": "q", "positive": "p", "negatives": [f"n{i}" for i in range(20)]}

    def flat(queries, documents):
        return [0.0] * len(documents)

    def select(stage, number):
        return compress_blocks(flat, [row], [list(range(20))], keep=6, selection="random", seed=13, stage=stage,
                               row_numbers=[number])[0]

    assert select(0, 10_007) != select(1, 0)
    assert select(0, 10_007) == select(0, 10_007)  # still deterministic
    assert len({tuple(select(0, n)) for n in range(20)}) > 15  # rows draw apart
