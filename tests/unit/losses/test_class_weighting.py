import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.class_weighting import (
    class_weighting_loss,
    class_weights,
    make_weighted_loss,
    weighted_cross_entropy,
)


def test_balanced_weights_are_inverse_frequency_with_mean_one():
    labels = [0] * 800 + [1] * 200  # 1:4, tumour = class 1
    weights = class_weights(labels, 2)
    np.testing.assert_allclose(weights, [1000 / (2 * 800), 1000 / (2 * 200)])  # 0.625, 2.5
    assert np.mean(weights[labels]) == pytest.approx(1.0)  # image-weighted mean: the loss keeps its scale
    np.testing.assert_allclose(class_weights([0, 1, 2, 2], 3), [4 / 3, 4 / 3, 4 / 6])


def test_a_class_without_training_images_is_refused():
    with pytest.raises(UserInputError, match=r"class\(es\) \[1\] have no training images"):
        class_weights([0, 0, 2], 3)


def test_weighted_loss_by_hand_and_equal_to_plain_loss_with_unit_weights():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1, 1])
    per_image = F.cross_entropy(logits, labels, reduction="none")
    weights = torch.tensor([0.625, 2.5])
    expected = (0.625 * per_image[0] + 2.5 * per_image[1] + 2.5 * per_image[2]) / 3
    assert weighted_cross_entropy(logits, labels, weights) == pytest.approx(expected.item())
    # The Trainer's global item count replaces the local batch size (sum over ranks and accumulation steps).
    assert weighted_cross_entropy(logits, labels, weights, torch.tensor(6)) == pytest.approx(expected.item() / 2)
    assert weighted_cross_entropy(logits, labels, torch.ones(2)) == pytest.approx(
        F.cross_entropy(logits, labels).item()
    )


def test_the_flag_changes_the_loss_weights_as_stated():
    labels = [0] * 800 + [1] * 200
    assert class_weighting_loss("none", labels, 2) is None  # the model's own, unweighted loss
    loss = class_weighting_loss("balanced", labels, 2)
    torch.testing.assert_close(loss.class_weights, torch.tensor([0.625, 2.5]))
    # A minority image's loss now counts 2.5 / 0.625 = 4 times a majority image's: the 1:4 imbalance undone.
    logits = torch.zeros(2, 2, requires_grad=True)
    loss({"logits": logits}, torch.tensor([0, 1])).backward()
    assert logits.grad[1].abs().sum() / logits.grad[0].abs().sum() == pytest.approx(4.0)
    with pytest.raises(UserInputError, match="--class_weighting 'inverse'"):
        class_weighting_loss("inverse", labels, 2)


def test_loss_accepts_model_outputs_as_tuple():
    loss = make_weighted_loss([1.0, 1.0])
    logits = torch.tensor([[0.0, 3.0]])
    assert loss((logits,), torch.tensor([1])) == pytest.approx(F.cross_entropy(logits, torch.tensor([1])).item())
