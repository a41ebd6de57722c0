"""The data group: where images come from, splits, input path, crop/flip defaults and bad images."""

from dataclasses import dataclass, field

from hf_vit_scaling.arguments.field_checks import require_at_least, require_folder
from hf_vit_scaling.data.host_transforms import SMALL_IMAGE_PX  # the rule over both flags: crops_at, flips_at
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.class_weighting import CLASS_WEIGHTING


@dataclass
class DataArguments:
    """Where the images come from and how they are prepared."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A Hub image-classification dataset (e.g. uoft-cs/cifar10, uoft-cs/cifar100) or a "
            "folder written by "
            "datasets' save_to_disk. Default (with no --train_dir either): scikit-learn's bundled digits, no network."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration name of --dataset_name."})
    train_dir: str | None = field(
        default=None, metadata={"help": "Image folder for training: one sub-folder per class (datasets' imagefolder)."}
    )
    validation_dir: str | None = field(
        default=None, metadata={"help": "Image folder for evaluation; without it --train_val_split carves one out."}
    )
    image_column_name: str | None = field(
        default=None,
        metadata={"help": "Column holding the images. Default: detected (first Image feature, img, image)."},
    )
    label_column_name: str | None = field(
        default=None,
        metadata={"help": "Column holding integer/class labels. Default: detected (label, fine_label, ...)."},
    )
    train_val_split: float = field(
        default=0.15, metadata={"help": "Fraction of the training split held out for evaluation when none is given."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many training images (after shuffling with --seed)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many evaluation images (after shuffling with --seed)."}
    )
    random_resized_crop: bool | None = field(
        default=None,
        metadata={
            "help": "Training augmentation: random resized crop (scale from --crop_scale_min to 1). Default: on for "
            f"model inputs of {SMALL_IMAGE_PX} px and more, off below (a crop of 8%% of a 28 px image is 8 px wide: "
            "on Fashion-MNIST it cost 12 points, recipes/fashion_mnist/README.md)."
        },
    )
    crop_scale_min: float = field(
        default=0.08, metadata={"help": "Smallest crop area fraction for --random_resized_crop (torchvision: 0.08)."}
    )
    horizontal_flip: bool | None = field(
        default=None,
        metadata={
            "help": f"Training augmentation: random horizontal flip. Default: on for model inputs of {SMALL_IMAGE_PX} "
            "px and more, off below (small-image sets are often digits or glyphs that a mirror changes, and on "
            "Fashion-MNIST's 5,000-image subset it cost 0.9 points in 15 epochs)."
        },
    )
    random_crop_padding: int = field(
        default=0,
        metadata={
            "help": "Training augmentation: shift each image by a random whole number of pixels in [-N, N] on each "
            "axis, edges repeated: torchvision's RandomCrop(size, padding=N, padding_mode='edge'), the CIFAR "
            "recipes' augmentation (N = 4 at 32 px). Applied after the resize, in model pixels. 0: off."
        },
    )
    input_path: str = field(
        default="auto",
        metadata={
            "help": "device: uint8 batches to the device, resize/augment/normalise there, batched (fast; "
            "one image size "
            "per batch). host_crop: for variable-size images, uint8 crops at the model's size cut on the CPU (JPEGs "
            "decoded at reduced size where the crop allows), flip/normalise on the device. per_sample: resize and "
            "augment each image on the CPU in float (the reference path). auto: device for prepared shards and "
            "images of one size, else host_crop; the choice is logged.",
            "choices": ["auto", "device", "host_crop", "per_sample"],
        },
    )
    on_bad_image: str = field(
        default="skip",
        metadata={
            "help": "An image that cannot be decoded (corrupt, truncated): skip leaves it out of its batch and counts "
            "and names it (skipped_images.json, all_results.json); fail decodes every image before training and "
            "stops at the first bad one, naming it.",
            "choices": ["skip", "fail"],
        },
    )

    class_weighting: str = field(
        default="none",
        metadata={
            "help": "Imbalanced classes: balanced weights each class's cross-entropy by N / (K x N_c) from the "
            "training labels (scikit-learn's 'balanced'), so rare classes count as much as common ones. none: the "
            "plain loss. Not combined with Mixup/CutMix or label smoothing.",
            "choices": list(CLASS_WEIGHTING),
        },
    )

    def __post_init__(self):
        if self.dataset_name and self.train_dir:
            raise UserInputError("--dataset_name and --train_dir are exclusive. Fix: pass one data source.")
        if self.validation_dir and not self.train_dir:
            raise UserInputError("--validation_dir needs --train_dir. Fix: add --train_dir or drop --validation_dir.")
        for flag in ("train_dir", "validation_dir"):
            require_folder(flag, getattr(self, flag), "point it at a folder of class sub-folders.")
        if not 0.0 < self.train_val_split < 1.0:
            raise UserInputError(f"--train_val_split must be between 0 and 1, got {self.train_val_split}.")
        if not 0.0 < self.crop_scale_min <= 1.0:
            raise UserInputError(f"--crop_scale_min must be in (0, 1], got {self.crop_scale_min}.")
        require_at_least(self, 1, "max_train_samples", "max_eval_samples")
        require_at_least(self, 0, "random_crop_padding")
