"""Tests `planning.plan`: which engine the planner recommends, and why."""

from hf_vit_scaling.models.presets import MODEL_PRESETS
from hf_vit_scaling.planning.plan import plan, recommend
from hf_vit_scaling.planning.shapes import vit_shape
from tests.unit.planning.plan_settings import settings


def test_recommendation_prefers_ddp_when_it_fits():
    result = plan(settings())
    assert result.recommended == "ddp"
    assert "DDP fits" in result.reason
    # ZeRO-2 moves fewer bytes in bf16 (half the gradient bytes), yet DDP is recommended because it fits.
    comm = {o.engine: o.speed.seconds["collectives"] for o in result.options}
    assert comm["zero2"] < comm["ddp"]


def test_recommendation_is_the_fastest_that_fits_when_ddp_does_not():
    # ViT-H/14 bf16 at 64 per GPU on 40 GB: DDP's 18Ψ + activations do not fit, sharded engines do.
    result = plan(settings(shape=vit_shape(MODEL_PRESETS["vit-h-14"]), per_device_batch=90))
    by_engine = {o.engine: o for o in result.options}
    assert not by_engine["ddp"].memory.fits
    fitting = [o for o in result.options if o.memory.fits]
    assert fitting
    assert result.recommended == min(fitting, key=lambda o: o.speed.step_s).engine
    assert "DDP needs" in result.reason


def test_recommendation_when_nothing_fits_suggests_the_largest_batch():
    result = plan(settings(shape=vit_shape(MODEL_PRESETS["vit-h-14"]), per_device_batch=4096))
    assert not any(o.memory.fits for o in result.options)
    best = max(o.max_batch for o in result.options)
    assert {o.engine: o.max_batch for o in result.options}[result.recommended] == best > 0
    assert "gradient_accumulation_steps" in result.reason
    engine, reason = recommend([])
    assert engine is None and "Nothing fits" in reason
