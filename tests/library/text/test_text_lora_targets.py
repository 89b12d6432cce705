"""LoRA targets chosen from the encoder's architecture (BERT: query/value, DistilBERT: q_lin/v_lin), explicit
names checked with a one-line error, and tiny local BERT-family folders loading and embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from privpipe.config import ConfigError
from privpipe.text.classifier import check_lora_targets, make_lora_classifier, resolve_lora_targets
from privpipe.text.encoder import embed, encoder_skeleton, load_encoder, tokenize
from text_fixtures import tiny_encoder_dir

TEXTS = ["apple banana with the gear", "piston and valve", "a very zesty quince"]  # the last: letters only
ATTENTION = {"bert": ("query", "value"), "distilbert": ("q_lin", "v_lin")}
LINEAR = {"bert": "query, key, value, dense", "distilbert": "q_lin, k_lin, v_lin, out_lin, lin1, lin2"}
CLASS = {"bert": "BertModel", "distilbert": "DistilBertModel"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    return {kind: tiny_encoder_dir(root, kind) for kind in ATTENTION}


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_auto_picks_the_attention_query_and_value_of_the_architecture(folders, kind):
    model, _ = load_encoder(folders[kind])
    assert type(model).__name__ == CLASS[kind]
    for requested in (None, "auto", ["auto"], " auto "):
        assert resolve_lora_targets(model, requested) == ATTENTION[kind]
    assert check_lora_targets(folders[kind], "auto") == ATTENTION[kind]


def test_the_folder_check_reads_no_weights(folders):
    skeleton = encoder_skeleton(folders["distilbert"])
    assert {p.device.type for p in skeleton.parameters()} == {"meta"}


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_lora_classifier_builds_and_runs_forward(folders, kind):
    torch.manual_seed(0)
    encoder, tokenizer = load_encoder(folders[kind])
    model = make_lora_classifier(encoder, classes=3, rank=2, alpha=4.0, targets="auto")
    ids, mask = tokenize(tokenizer, TEXTS, max_length=16)
    logits = model(torch.from_numpy(ids), torch.from_numpy(mask))
    assert logits.shape == (3, 3) and torch.isfinite(logits).all()
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name in trainable if ".lora_A" in name}
    assert adapted == set(ATTENTION[kind])
    assert sum(".lora_A" in name for name in trainable) == 2 * 2  # 2 layers x (query, value)
    assert all(".lora_" in name or name.startswith("head.") for name in trainable)
    logits.sum().backward()  # the adapters and head get gradients: a trainable model, not just a forward
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_dotted_suffixes_and_subsets_are_accepted(folders):
    model, _ = load_encoder(folders["distilbert"])
    assert resolve_lora_targets(model, ["attention.q_lin"]) == ("attention.q_lin",)
    assert resolve_lora_targets(model, ("q_lin", "k_lin", "v_lin")) == ("q_lin", "k_lin", "v_lin")
    assert resolve_lora_targets(model, "q_lin, v_lin") == ("q_lin", "v_lin")  # text.lora_targets as written


@pytest.mark.parametrize("kind, wrong", [("distilbert", "query"), ("bert", "q_lin"), ("bert", "attention")])
def test_a_wrong_name_is_one_line_listing_the_linear_layers(folders, kind, wrong):
    model, _ = load_encoder(folders[kind])
    expected = (f"text.lora_targets: no module named {wrong!r} in {CLASS[kind]}; "
                f"its linear layers are: {LINEAR[kind]}")
    with pytest.raises(ConfigError) as caught:
        resolve_lora_targets(model, [ATTENTION[kind][0], wrong])
    assert str(caught.value) == expected
    with pytest.raises(ConfigError) as caught:  # as the pipeline builds it: before peft touches the encoder
        make_lora_classifier(model, classes=2, rank=2, alpha=4.0, targets=(wrong,))
    assert str(caught.value) == expected
    assert not any("lora" in name for name, _ in model.named_modules())
    with pytest.raises(ConfigError) as caught:  # from the folder, before any encoding
        check_lora_targets(folders[kind], f"{wrong}")
    assert str(caught.value) == (f"text.lora_targets: no module named {wrong!r} in {folders[kind]} ({CLASS[kind]}); "
                                 f"its linear layers are: {LINEAR[kind]}")


def test_auto_without_attention_projections_and_auto_in_a_list_are_refused():
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"^text.lora_targets: auto found no attention query/value projections "
                                          r"in Sequential; name some of its linear layers: 0, 2$"):
        resolve_lora_targets(plain, "auto")
    with pytest.raises(ConfigError, match=r"^text.lora_targets: 'auto' stands alone"):
        resolve_lora_targets(plain, ["auto", "0"])


@pytest.mark.parametrize("kind", sorted(ATTENTION))
def test_load_encoder_and_embed_on_the_tiny_folders(folders, kind):
    model, tokenizer = load_encoder(folders[kind])
    vectors = embed(model, tokenizer, TEXTS, max_length=16, batch_size=2)
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    alone = embed(model, tokenizer, TEXTS[2:], max_length=16, batch_size=1)  # rows come back in input order
    np.testing.assert_allclose(vectors[2], alone[0], atol=1e-5)
    assert tokenizer.unk_token_id not in tokenize(tokenizer, TEXTS, max_length=16)[0]
