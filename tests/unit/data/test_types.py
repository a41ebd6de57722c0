"""Tests `data.types`: image and label column detection."""

import pytest
from datasets import ClassLabel, Features, Value
from datasets import Image as ImageFeature

from hf_vit_scaling.data.types import detect_image_column, detect_label_column
from hf_vit_scaling.errors import UserInputError


def test_unknown_column_names_are_rejected():
    features = Features({"img": ImageFeature(), "fine_label": ClassLabel(names=["a"]), "coarse_label": Value("int8")})
    assert detect_image_column(features, None) == "img"
    assert detect_label_column(features, None) == "fine_label"
    assert detect_label_column(features, "coarse_label") == "coarse_label"
    with pytest.raises(UserInputError, match="--image_column_name 'picture'"):
        detect_image_column(features, "picture")
    with pytest.raises(UserInputError, match="--label_column_name 'lbl'"):
        detect_label_column(features, "lbl")
