"""Tests `training.distillation`: DeiT's soft and hard losses against values computed from the formulas with plain
torch ops on a tiny batch, with soft (Mixup) targets, through the pixel-keeping hook, and the frozen teacher."""

import math

import pytest
import torch
from transformers import ResNetConfig, ResNetForImageClassification

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.distillation import DEFAULT_ALPHA, DistillationLoss, distillation_loss
from hf_vit_scaling.regularization.batch_augmenter import BatchAugmenter
from hf_vit_scaling.training.distillation import Teacher, load_teacher_model
from tests.helpers.builders import alter_saved_weights

# 2 images, 3 classes
STUDENT = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.2]])
TEACHER = torch.tensor([[1.0, 3.0, 0.0], [-0.5, 0.0, 2.5]])
LABELS = torch.tensor([0, 1])


def log_softmax_by_hand(logits: torch.Tensor) -> torch.Tensor:
    return logits - torch.log(torch.exp(logits).sum(dim=1, keepdim=True))


def ce_by_hand(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean over images of -sum_c y_c log softmax(s)_c."""
    return float(-(targets * log_softmax_by_hand(logits)).sum(dim=1).mean())


def one_hot(labels: torch.Tensor, classes: int = 3) -> torch.Tensor:
    return torch.eye(classes)[labels]


def soft_by_hand(student, teacher, targets, alpha, tau) -> float:
    """(1 - a) CE + a tau^2 sum_ic p_t (log p_t - log p_s) / (n C): DeiT's losses.py, KL summed then / numel."""
    p_t = torch.exp(log_softmax_by_hand(teacher / tau))
    kl_sum = (p_t * (log_softmax_by_hand(teacher / tau) - log_softmax_by_hand(student / tau))).sum()
    return (1 - alpha) * ce_by_hand(student, targets) + alpha * tau * tau * float(kl_sum) / student.numel()


def test_soft_loss_matches_deit_formula():
    got = distillation_loss({"logits": STUDENT}, one_hot(LABELS), TEACHER, "soft", alpha=0.1, tau=3.0)
    assert float(got) == pytest.approx(soft_by_hand(STUDENT, TEACHER, one_hot(LABELS), 0.1, 3.0), rel=1e-6)
    # and against torch's own kl_div as DeiT calls it
    deit_kl = (
        torch.nn.functional.kl_div(
            torch.log_softmax(STUDENT / 3, dim=1),
            torch.log_softmax(TEACHER / 3, dim=1),
            reduction="sum",
            log_target=True,
        )
        * 9
        / STUDENT.numel()
    )
    ce = torch.nn.functional.cross_entropy(STUDENT, LABELS)
    assert float(got) == pytest.approx(float(0.9 * ce + 0.1 * deit_kl), rel=1e-6)


def test_soft_loss_is_the_label_loss_when_teacher_agrees_and_alpha_zero():
    same = distillation_loss({"logits": STUDENT}, one_hot(LABELS), STUDENT, "soft", alpha=0.5, tau=3.0)
    assert float(same) == pytest.approx(0.5 * ce_by_hand(STUDENT, one_hot(LABELS)), rel=1e-6)  # KL(p || p) = 0
    none = distillation_loss({"logits": STUDENT}, one_hot(LABELS), TEACHER, "soft", alpha=0.0)
    assert float(none) == pytest.approx(ce_by_hand(STUDENT, one_hot(LABELS)), rel=1e-6)


def test_hard_loss_with_two_heads_matches_half_and_half():
    dist = torch.tensor([[0.3, 0.1, 0.0], [1.0, -1.0, 0.5]])
    outputs = {"logits": (STUDENT + dist) / 2, "cls_logits": STUDENT, "distillation_logits": dist}
    got = distillation_loss(outputs, one_hot(LABELS), TEACHER, "hard", alpha=DEFAULT_ALPHA["hard"])
    teacher_argmax = one_hot(torch.tensor([1, 2]))  # argmax of each TEACHER row
    expected = 0.5 * ce_by_hand(STUDENT, one_hot(LABELS)) + 0.5 * ce_by_hand(dist, teacher_argmax)
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_soft_targets_from_mixup_and_global_item_count():
    mixed = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.4, 0.6]])
    got = distillation_loss({"logits": STUDENT}, mixed, TEACHER, "soft", alpha=0.1, tau=3.0)
    assert float(got) == pytest.approx(soft_by_hand(STUDENT, TEACHER, mixed, 0.1, 3.0), rel=1e-6)
    # num_items_in_batch (the accumulated, all-rank count): the sums are divided by it instead of by n = 2
    halved = distillation_loss({"logits": STUDENT}, mixed, TEACHER, "soft", 0.1, 3.0, num_items_in_batch=4)
    assert float(halved) == pytest.approx(float(got) / 2, rel=1e-6)


class FixedTeacher:
    """Logits = a fixed linear map of the mean pixel per channel; records the pixels it was given."""

    def __init__(self):
        self.seen = []

    def logits(self, pixels):
        self.seen.append(pixels.clone())
        return pixels.mean(dim=(2, 3))  # (n, 3): 3 "classes"


def test_teacher_sees_the_augmented_pixels_and_evaluation_is_plain_cross_entropy():
    model = torch.nn.Module()
    model.forward = lambda pixel_values=None: {"logits": pixel_values.mean(dim=(2, 3)) * 2}
    augmenter = BatchAugmenter(3, (0.5,) * 3, (0.5,) * 3, mixup_alpha=1.0, generator=torch.Generator().manual_seed(0))
    augmenter.attach(model)
    teacher = FixedTeacher()
    loss = DistillationLoss(teacher, 3, "soft", 0.1, 3.0, augmenter)
    loss.attach(model)
    pixels = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    model.train()
    outputs = model(pixel_values=pixels)
    got = loss(outputs, LABELS)
    mixed_pixels = teacher.seen[0]
    assert not torch.equal(mixed_pixels, pixels)  # Mixup changed them, and the teacher got the changed batch
    assert torch.allclose(outputs["logits"], mixed_pixels.mean(dim=(2, 3)) * 2)
    # the targets are the augmenter's for that forward: its lam recovered from the pixels
    lam = (mixed_pixels - pixels[[1, 0]]) / (pixels - pixels[[1, 0]])  # Mixup: x = lam x + (1 - lam) x_partner
    lam = lam.flatten(1).median(dim=1).values
    targets = lam.view(-1, 1) * one_hot(LABELS) + (1 - lam.view(-1, 1)) * one_hot(LABELS[[1, 0]])
    expected = soft_by_hand(outputs["logits"], mixed_pixels.mean(dim=(2, 3)), targets, 0.1, 3.0)
    assert float(got) == pytest.approx(expected, rel=1e-4)

    model.eval()
    outputs = model(pixel_values=pixels)
    assert float(loss(outputs, LABELS)) == pytest.approx(ce_by_hand(outputs["logits"], one_hot(LABELS)), rel=1e-6)
    assert len(teacher.seen) == 1  # no teacher forward in evaluation


def tiny_resnet(labels=("a", "b", "c")) -> ResNetForImageClassification:
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                          num_labels=len(labels), id2label=dict(enumerate(labels)),
                          label2id={n: i for i, n in enumerate(labels)})  # fmt: skip
    torch.manual_seed(0)
    return ResNetForImageClassification(config)


def test_teacher_is_frozen_in_eval_mode_and_in_the_run_precision(tmp_path):
    tiny_resnet().save_pretrained(tmp_path / "teacher")
    teacher = Teacher.from_pretrained(str(tmp_path / "teacher"), torch.bfloat16)
    assert teacher.labels == ["a", "b", "c"]
    assert not teacher.model.training
    assert all(not p.requires_grad and p.dtype == torch.bfloat16 for p in teacher.model.parameters())
    logits = teacher.logits(torch.randn(2, 3, 16, 16, requires_grad=True))
    assert logits.dtype == torch.float32 and logits.shape == (2, 3) and not logits.requires_grad
    assert math.isfinite(float(logits.sum()))


def test_missing_or_unreadable_teacher_is_one_error_naming_the_flag(tmp_path):
    with pytest.raises(UserInputError, match="--teacher_model .* is not a folder"):
        load_teacher_model(str(tmp_path / "nope"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(UserInputError, match="--teacher_model .* could not be read") as err:
        load_teacher_model(str(tmp_path / "broken"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("alteration, words", [("missing", "1 missing"), ("unexpected", "1 unexpected"),
                                               ("wrong shape", "1 of another shape")])  # fmt: skip
def test_a_teacher_not_matching_its_model_tensor_for_tensor_is_refused(tmp_path, alteration, words):
    """`from_pretrained` fills a missing tensor at random, drops an unexpected one and (without
    ignore_mismatched_sizes) raises a bare RuntimeError on one of another shape. Fails if the strict load skips the
    unexpected or the mismatched keys, or lets transformers' RuntimeError through as "could not be read"."""
    tiny_resnet().save_pretrained(tmp_path / "teacher")
    alter_saved_weights(tmp_path / "teacher", alteration)
    with pytest.raises(UserInputError, match=r"--teacher_model .* does not hold every tensor of its model") as err:
        load_teacher_model(str(tmp_path / "teacher"))
    assert words in str(err.value) and "could not be read" not in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
