"""The load dtype of each stage, from one resolved field: generation (the transformers backend),
training and evaluation load the target in `target.load_precision`, FP8 included, on a tiny target."""

from __future__ import annotations

import pytest
import torch
from helpers_dflash import DRAFTER, tiny_target
from helpers_models import make_recipe, resolved, stage_context

from dflashx.backends.transformers_local import TransformersBackend
from dflashx.config.fields import TORCH_DTYPE
from dflashx.config.schema import ChatTemplateSpec, GenerateStage
from dflashx.dflash import trainer
from dflashx.dflash.fp8 import FP8Linear
from dflashx.dflash.trainer import TrainJob
from dflashx.stages import eval as eval_stage
from dflashx.stages.generate import make_backend


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("load") / "target", layers=4)


def _recipe(target, precision: str):
    return make_recipe(target={"model": str(target), "precision": precision}, drafter=DRAFTER,
                       stages={"generate": {"backend": "transformers"}})


def loaded_by_each_stage(target, precision: str, tmp_path) -> dict[str, torch.nn.Module]:
    recipe = _recipe(target, precision)
    with make_backend(stage_context("generate", recipe, tmp_path)) as backend:
        generate = backend.model
    evaluate, _ = eval_stage._load_target(stage_context("eval", recipe, tmp_path))
    job = TrainJob.of(resolved(recipe), tmp_path / "train", tmp_path / "unused", target, target)
    train, _, _ = trainer._load_target(job, torch.device("cpu"))
    return {"generate": generate, "eval": evaluate, "train": train}


def test_every_stage_loads_the_resolved_precision(target, tmp_path):
    # bf16 on the CPU profile resolves to fp32 (resolve.load_precision); the backend loaded bf16 before
    assert resolved(_recipe(target, "bf16")).target.load_precision == "fp32"
    models = loaded_by_each_stage(target, "bf16", tmp_path)
    want = getattr(torch, TORCH_DTYPE["fp32"])
    assert {name: m.model.embed_tokens.weight.dtype for name, m in models.items()} == dict.fromkeys(models, want)


def test_fp8_runs_fp8_linears_in_generation_as_in_eval(target, tmp_path):
    """fp8 was loaded as fp32 by the backend's own table; it now converts the decoder layers' linears
    as evaluation does (training converts those up to its deepest tapped layer)."""
    assert resolved(_recipe(target, "fp8")).target.load_precision == "fp8"
    models = loaded_by_each_stage(target, "fp8", tmp_path)
    fp8 = {name: sum(isinstance(x, FP8Linear) for x in m.modules()) for name, m in models.items()}
    per_layer = 7  # q, k, v, o, gate, up, down
    assert fp8 == {"generate": 4 * per_layer, "eval": 4 * per_layer,
                   "train": (max(DRAFTER["target_layer_ids"]) + 1) * per_layer}


def test_the_backend_refuses_fp8_without_a_converter(target):
    cfg = GenerateStage(backend="transformers")
    with pytest.raises(ValueError, match="fp8"):
        TransformersBackend(target, target, cfg, ChatTemplateSpec(), "fp8")


def test_every_stage_loads_the_tokenizer_target_tokenizer_names(target, tmp_path):
    """`target.tokenizer` names another folder: generation, evaluation and training (through the job the
    train stage builds) all load that tokenizer, not the one beside the model (dflashx.targets.load)."""
    from helpers_dflash import TEXTS

    from dflashx.stages.train import INPUT, build_job
    from dflashx.tiny.tokenizer import train_tokenizer

    other = train_tokenizer([t.upper().replace("STEP", "pace") for t in TEXTS], vocab_size=320,
                            out_dir=tmp_path / "other_tokenizer")
    own = trainer.tokenizer_from(target)
    assert "pace" in other.get_vocab() and "pace" not in own.get_vocab()  # the two are told apart
    recipe = make_recipe(target={"model": str(target), "tokenizer": str(tmp_path / "other_tokenizer")},
                         drafter=DRAFTER, stages={"generate": {"backend": "transformers"}})
    with make_backend(stage_context("generate", recipe, tmp_path)) as backend:
        generate = backend.tokenizer
    _, evaluate = eval_stage._load_target(stage_context("eval", recipe, tmp_path))
    job = build_job(stage_context("train", recipe, tmp_path, inputs={INPUT: tmp_path / "unused"}))
    _, train, _ = trainer._load_target(job, torch.device("cpu"))
    for tokenizer in (generate, evaluate, train):
        assert tokenizer.get_vocab() == other.get_vocab()
