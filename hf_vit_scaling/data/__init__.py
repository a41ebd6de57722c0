"""Image-classification data: where images come from (`sources`; prepared uint8 shards: `shards`, written by
`prepare`), decoding that survives bad files (`decoding`), and the input paths: per-sample transforms on the host
(`host_transforms`), uint8 batches transformed on the device (`device_transforms`), for variable-size images
fixed-size uint8 crops cut on the host (`crop_decode`); a training split read as a stream, each rank its own shards
(`streaming`)."""

from hf_vit_scaling.data.crop_decode import attach_host_crop_transforms
from hf_vit_scaling.data.decoding import find_bad_images, stack_batch, with_sample_index
from hf_vit_scaling.data.device_transforms import DevicePreprocessor, attach_uint8_transforms, collate_uint8_batch
from hf_vit_scaling.data.host_transforms import ImageTransform, attach_transforms
from hf_vit_scaling.data.input_path import choose_input_path
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.data.sources import BUILTIN_DATASET
from hf_vit_scaling.data.types import ImageClassificationData

# The per-sample path's collate is the plain stack.
collate_image_batch = stack_batch

__all__ = [
    "BUILTIN_DATASET",
    "DevicePreprocessor",
    "ImageClassificationData",
    "ImageTransform",
    "attach_host_crop_transforms",
    "attach_transforms",
    "attach_uint8_transforms",
    "choose_input_path",
    "collate_image_batch",
    "collate_uint8_batch",
    "find_bad_images",
    "load_image_classification_data",
    "stack_batch",
    "with_sample_index",
]
