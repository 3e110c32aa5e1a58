"""ColPali (transformers' ColPaliForRetrieval: PaliGemma under a projection, engine/models/paligemma.py) on a
tiny random checkpoint: each query and document laid out as ColPaliProcessor lays it out ("<bos>Question:
{text}" and ten <pad> then a newline, its tokenizer's own <bos> turned off; an image document its patches'
placeholders, then "<bos>Describe the image.\\n"), every token's projected unit vector within 1e-5 of
transformers' ColPaliForRetrieval (the processor's token_type_ids: every token attends both ways) with its
own image processor; rerank by MaxSim against image and text documents; /pooling's token vectors of queries
and of image documents; checkpoints as transformers 5 saves them and as the hub's hold them."""

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from benchmarks.image_checkpoints import COLPALI_QUERY, colpali_checkpoint, colpali_vectors
from tests.api import test_colqwen as colqwen

# weights of half the usual noise: at 0.2 this tiny net amplifies the image processor's float rounding of
# pixels (1e-7) to 2e-5 in a token's vector, where transformers' own float32 and float64 differ by 4e-6
STD = 0.1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return colpali_checkpoint(tmp_path_factory.mktemp("colpali") / "colpali", std=STD)


@pytest.fixture(scope="module")
def served(checkpoint):
    folder, model = checkpoint
    config = ServerConfig(models=(str(folder),), served_model_names=(("colpali",),), tokenizer_threads=2)
    with TestClient(create_app(config)) as client:
        yield client, lambda items: colpali_vectors(model, folder, items)


def test_rerank_by_max_sim_against_images_and_texts(served):
    colqwen.check_rerank(*served, "colpali")


def test_token_vectors_of_queries(served):
    """Each query's vectors, as many as the processor's tokens: one <bos>, not the tokenizer's too."""
    colqwen.check_query_vectors(*served, "colpali")


def test_token_vectors_of_image_documents_and_texts(served):
    colqwen.check_image_document_vectors(*served, "colpali")


def test_the_hubs_weight_names_load(checkpoint, tmp_path):
    """The hub's ColPali checkpoints name the model as transformers 4 did ("vlm.model.language_model.",
    "vlm.model.vision_tower.vision_model."): posy reads them as it reads transformers 5's."""
    import shutil

    from safetensors.torch import load_file, save_file

    from engine.attention import select_backend
    from engine.checkpoint.resolve import resolve_model
    from engine.weights import load_model

    folder, model = checkpoint
    hub = tmp_path / "hub"
    shutil.copytree(folder, hub)
    renamed = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        name = name.replace("vlm.language_model.model.", "vlm.model.language_model.")
        name = name.replace("vlm.vision_tower.", "vlm.model.vision_tower.vision_model.")
        renamed[name.replace("vlm.multi_modal_projector.", "vlm.model.multi_modal_projector.")] = tensor
    assert any(".vision_model." in name for name in renamed)
    save_file(renamed, str(hub / "model.safetensors"))
    loaded = load_model(resolve_model(str(hub)), "cpu", torch.float32, select_backend("torch", "cpu"))
    theirs = model.vlm.vision_tower.embeddings.position_embedding.weight.detach().numpy()
    np.testing.assert_array_equal(loaded.backbone.vision.positions.weight.detach().numpy(), theirs)


def test_a_long_text_document_cut_to_max_tokens_per_doc_keeps_its_closing_tokens(served, checkpoint):
    colqwen.check_long_text_cut_keeps_its_closing_tokens(*served, "colpali", checkpoint[0], COLPALI_QUERY)


def test_a_text_document_past_the_window_ranks_by_chunks_laid_out_as_texts(served, checkpoint):
    colqwen.check_long_text_chunks_keep_their_layout(*served, "colpali", checkpoint[0], COLPALI_QUERY)


def test_an_image_query_is_a_400_and_the_server_ranks_on(served):
    colqwen.check_image_query_refused(served[0], "colpali")


def test_a_generative_paligemma_is_not_served_as_an_embedder(checkpoint, tmp_path):
    """PaliGemma packs as ColPali's backbone only: a PaliGemmaForConditionalGeneration folder is refused
    with a reason, not embedded by a pooling it was never trained for."""
    import json
    import shutil

    from engine.checkpoint.resolve import resolve_model
    from engine.errors import UnsupportedModel

    folder, _ = checkpoint
    generative = tmp_path / "paligemma"
    shutil.copytree(folder, generative)
    config = json.loads((folder / "config.json").read_text())["vlm_config"]
    config["architectures"] = ["PaliGemmaForConditionalGeneration"]
    (generative / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel):
        resolve_model(str(generative), model_impl="posy")
