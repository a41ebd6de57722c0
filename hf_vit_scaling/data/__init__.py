"""Image-classification data: where images come from (`sources`; prepared uint8 shards: `shards`, written by
`prepare`), decoding that survives bad files (`decoding`), and the input paths: per-sample transforms on the host
(`host_transforms`), uint8 batches transformed on the device (`device_transforms`), for variable-size images
fixed-size uint8 crops cut on the host (`crop_decode`); a training split read as a stream, each rank its own shards
(`streaming`)."""

from hf_vit_scaling.utils import lazy_exports

# Imported on first use (hf_vit_scaling/__init__.py): the per-sample path loads neither streaming nor the device path.
_EXPORTS = {
    "attach_host_crop_transforms": ".crop_decode",
    "collate_image_batch": ".decoding",
    "find_bad_images": ".decoding",
    "stack_batch": ".decoding",
    "with_sample_index": ".decoding",
    "DevicePreprocessor": ".device_transforms",
    "attach_uint8_transforms": ".device_transforms",
    "collate_uint8_batch": ".device_transforms",
    "ImageTransform": ".host_transforms",
    "attach_transforms": ".host_transforms",
    "choose_input_path": ".input_path",
    "load_image_classification_data": ".loading",
    "BUILTIN_DATASET": ".sources",
    "ImageClassificationData": ".types",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
